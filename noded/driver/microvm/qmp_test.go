package microvm

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"path/filepath"
	"testing"
	"time"
)

// A command's reply that comes after its deadline (QEMU busy) is not taken
// as the next command's: each reply is matched by the command's id. Before,
// the client read the next line, so a late "migration active" or an empty
// return answered the command after it.
func TestALateQMPReplyIsNotTheNextCommands(t *testing.T) {
	path := filepath.Join(t.TempDir(), "qmp.sock")
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	release := make(chan struct{})
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		fmt.Fprintln(c, `{"QMP":{"version":{},"capabilities":[]}}`)
		r := bufio.NewScanner(c)
		for r.Scan() {
			var cmd struct {
				Execute string          `json:"execute"`
				ID      json.RawMessage `json:"id"`
			}
			_ = json.Unmarshal(r.Bytes(), &cmd)
			id := "" // what QEMU echoes: the command's id, if it has one
			if len(cmd.ID) > 0 {
				id = `,"id":` + string(cmd.ID)
			}
			switch cmd.Execute {
			case "query-migrate":
				// Answered late, after the next command is sent, and
				// cut in two, as a deadline could cut it.
				<-release
				line := fmt.Sprintf(`{"return":{"status":"active"}%s}`, id)
				fmt.Fprint(c, line[:10])
				time.Sleep(10 * time.Millisecond)
				fmt.Fprintln(c, line[10:])
			case "query-status":
				fmt.Fprintln(c, `{"event":"STOP"}`)
				fmt.Fprintf(c, `{"return":{"status":"postmigrate"}%s}`+"\n", id)
			default:
				fmt.Fprintf(c, `{"return":{}%s}`+"\n", id)
			}
		}
	}()
	q, err := DialQMP(ctxT(t, 10*time.Second), path)
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	short, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if _, _, err := q.Migration(short); err == nil {
		t.Fatal("query-migrate answered before its reply was sent")
	}
	close(release)
	st, err := q.Status(ctxT(t, 10*time.Second))
	if err != nil || st != "postmigrate" {
		t.Fatalf("query-status after a late reply: %q, %v; want postmigrate", st, err)
	}
}
