package guest

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"slices"
	"strings"
	"unicode/utf8"
)

// Wire format. Every message in either direction is a frame:
//
//	kind (1 byte) | length (4 bytes, big endian) | payload (length bytes)
//
// A call is one yamux stream. The host writes a frameRequest (JSON
// Request), then, for calls that carry data (write, exec with stdin),
// frameData frames and a frameEOF. The guest answers with frameStdout,
// frameStderr or frameData frames and ends with exactly one frameResult
// (JSON Result) or frameError (a UTF-8 message). A list whose Result does
// not fit one frame comes first in frameFiles frames, each a Result holding
// some of the entries; the host appends them in order, then the Result's
// own. A request may instead be a frameRequestWire (the wire codec,
// wire.go), answered by a frameResultWire in place of the frameResult and
// frameFilesWire in place of frameFiles.
const (
	frameRequest byte = 'q'
	frameData    byte = 'd'
	frameEOF     byte = 'z'
	frameStdout  byte = 'o'
	frameStderr  byte = 'e'
	frameResult  byte = 'r'
	frameFiles   byte = 'l'
	frameError   byte = 'x'
)

// MaxFrame is the largest payload of one frame. Larger data is split.
const MaxFrame = 1 << 20

// Limits the guest enforces on requests.
const (
	MaxCommandBytes = 128 << 10 // command line plus environment
	MaxPathBytes    = 4096
	// MaxTimeoutMS bounds an exec's timeout (a year): larger values would
	// overflow time.Duration in the agent.
	MaxTimeoutMS = 365 * 24 * 3600 * 1000
	// MaxPids bounds a claim's process limit: Linux's largest pid_max.
	MaxPids = 1 << 22
)

// DefaultFileMode is the mode of a file written without one.
const DefaultFileMode = 0o644

// Op names a call.
type Op string

// The calls.
const (
	OpPing  Op = "ping"
	OpExec  Op = "exec"
	OpRead  Op = "read"
	OpWrite Op = "write"
	OpList  Op = "list"
	OpStat  Op = "stat"
	OpClaim Op = "claim"
	OpStats Op = "stats"
	OpSync  Op = "sync"
	// OpCancel abandons a running exec, named by its stream's id
	// (Request.Call): the host sends it when it gives up on an exec whose
	// stdin it was still sending, since the agent may be waiting on the
	// command's stdin pipe and not reading the exec's stream.
	OpCancel Op = "cancel"
)

// Request is the first frame of every call. Fields not used by Op are empty.
type Request struct {
	Op Op `json:"op"`

	// exec
	Argv      []string          `json:"argv,omitempty"`
	Env       map[string]string `json:"env,omitempty"`
	Dir       string            `json:"dir,omitempty"`
	TimeoutMS int64             `json:"timeout_ms,omitempty"`
	Stdin     bool              `json:"stdin,omitempty"`

	// read, write, list, stat
	Path  string `json:"path,omitempty"`
	Mode  uint32 `json:"mode,omitempty"`
	Limit int64  `json:"limit,omitempty"` // read: at most this many bytes (0: no limit)
	// write: Mode is the file's mode even when 0 (a file made 0000).
	// Without it a Mode of 0 means 0644, as it does to an agent from
	// before ModeSet, which ignores the field.
	ModeSet bool `json:"mode_set,omitempty"`

	// claim
	UnixNano int64      `json:"unix_nano,omitempty"`
	Entropy  []byte     `json:"entropy,omitempty"`
	Hostname string     `json:"hostname,omitempty"`
	Pids     int        `json:"pids,omitempty"`
	Net      *NetConfig `json:"net,omitempty"`

	// cancel
	Call uint32 `json:"call,omitempty"` // the exec's yamux stream id
}

// NetConfig is a sandbox's network, set at claim. In a microVM the agent
// configures the interface; in a container the node already has, and the
// agent writes only the resolver.
type NetConfig struct {
	Iface    string   `json:"iface"`              // "eth0"
	Addrs    []string `json:"addrs,omitempty"`    // CIDR, e.g. "169.254.77.2/30"
	Gateways []string `json:"gateways,omitempty"` // default routes, one per family
	DNS      []string `json:"dns,omitempty"`      // nameservers for /etc/resolv.conf
}

// Equal reports whether c and o are the same settings, in the same order.
func (c NetConfig) Equal(o NetConfig) bool {
	return c.Iface == o.Iface && slices.Equal(c.Addrs, o.Addrs) && slices.Equal(c.Gateways, o.Gateways) && slices.Equal(c.DNS, o.DNS)
}

func (c NetConfig) clone() NetConfig {
	c.Addrs, c.Gateways, c.DNS = slices.Clone(c.Addrs), slices.Clone(c.Gateways), slices.Clone(c.DNS)
	return c
}

// Check validates c, naming the field at fault.
func (c *NetConfig) Check() error {
	if c.Iface == "" || len(c.Iface) > 15 || strings.ContainsAny(c.Iface, "/ \x00") {
		return fmt.Errorf("net.iface: %q is not an interface name", c.Iface)
	}
	if len(c.Addrs) > 4 || len(c.Gateways) > 2 || len(c.DNS) > 3 {
		return errors.New("net: at most 4 addrs, 2 gateways and 3 dns")
	}
	for i, a := range c.Addrs {
		if _, err := netip.ParsePrefix(a); err != nil {
			return fmt.Errorf("net.addrs[%d]: %q is not an address/prefix", i, a)
		}
	}
	for i, a := range c.Gateways {
		if _, err := netip.ParseAddr(a); err != nil {
			return fmt.Errorf("net.gateways[%d]: %q is not an address", i, a)
		}
	}
	for i, a := range c.DNS {
		if _, err := netip.ParseAddr(a); err != nil {
			return fmt.Errorf("net.dns[%d]: %q is not an address", i, a)
		}
	}
	return nil
}

// Result is the last frame of a successful call.
type Result struct {
	// exec
	ExitCode   int   `json:"exit_code"`
	Signal     int   `json:"signal,omitempty"`
	TimedOut   bool  `json:"timed_out,omitempty"`
	DurationUS int64 `json:"duration_us,omitempty"`

	// read, write, stat
	File *FileInfo `json:"file,omitempty"`
	// list
	Files []FileInfo `json:"files,omitempty"`
	// stats
	Stats *Stats `json:"stats,omitempty"`
	// ping, claim: the guest's clock after the call
	GuestUnixNano int64 `json:"guest_unix_nano,omitempty"`
	// ping, claim: this agent serves a claim before it accepts the next
	// call, so a host may send its first calls right behind a claim
	// without waiting for the answer (see Client.StartClaim).
	Ordered bool `json:"ordered,omitempty"`
	// ping, claim: this agent reads requests in the wire codec (wire.go)
	// and answers them in it; a Client that sees it uses that codec for
	// its later calls.
	Wire bool `json:"wire,omitempty"`
}

// FileInfo describes one file in the guest.
type FileInfo struct {
	Name    string `json:"name"`
	Size    int64  `json:"size"`
	Mode    uint32 `json:"mode"` // Go fs.FileMode bits
	ModNano int64  `json:"mod_nano"`
	Dir     bool   `json:"dir,omitempty"`
}

// Stats is a snapshot of the guest's resources.
type Stats struct {
	MemTotalKB     int64   `json:"mem_total_kb"`
	MemAvailableKB int64   `json:"mem_available_kb"`
	Load1          float64 `json:"load1"`
	Procs          int     `json:"procs"`
	DiskTotalKB    int64   `json:"disk_total_kb"`
	DiskFreeKB     int64   `json:"disk_free_kb"`
	UptimeMS       int64   `json:"uptime_ms"`
}

// RemoteError is an error the guest reported for a call. Msg is valid
// UTF-8, at most MaxRemoteErrorBytes of the guest's message and a note of
// how much was cut.
type RemoteError struct{ Msg string }

func (e *RemoteError) Error() string { return "guest: " + e.Msg }

// MaxRemoteErrorBytes bounds what the host keeps of a guest's error
// message. The guest is not trusted, and its message may be a whole frame
// (1 MiB) of anything: the host logs it, retries behind it, and sends it
// to API clients. The agent's own messages are a line.
const MaxRemoteErrorBytes = 4 << 10

// remoteError is the RemoteError of an error frame's payload: its head,
// made valid UTF-8, and how many bytes were cut.
func remoteError(p []byte) *RemoteError {
	head := p[:min(len(p), MaxRemoteErrorBytes)]
	s := strings.ToValidUTF8(string(head), "\uFFFD")
	cut := len(head) < len(p)
	for len(s) > MaxRemoteErrorBytes { // invalid bytes became 3-byte runes
		_, n := utf8.DecodeLastRuneInString(s)
		s, cut = s[:len(s)-n], true
	}
	if cut {
		s += fmt.Sprintf(" [cut: the guest's message was %d bytes]", len(p))
	}
	return &RemoteError{Msg: s}
}

// ErrFrameTooLarge is returned for a frame whose length exceeds MaxFrame.
var ErrFrameTooLarge = errors.New("guest: frame too large")

func writeFrame(w io.Writer, kind byte, p []byte) error {
	if len(p) > MaxFrame {
		return ErrFrameTooLarge
	}
	var h [5]byte
	h[0] = kind
	binary.BigEndian.PutUint32(h[1:], uint32(len(p)))
	if len(p) == 0 {
		_, err := w.Write(h[:])
		return err
	}
	// One write per frame keeps frames whole on the yamux stream.
	buf := make([]byte, 0, 5+len(p))
	buf = append(append(buf, h[:]...), p...)
	_, err := w.Write(buf)
	return err
}

func writeJSON(w io.Writer, kind byte, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return writeFrame(w, kind, b)
}

// firstReadBytes is what readFrame allocates for a payload before any of
// it arrived.
const firstReadBytes = 64 << 10

// readFrame reads one frame. The payload is freshly allocated, and grows
// as it arrives: the header's length is only the peer's word (the guest is
// not trusted), and a guest that announced MaxFrame bytes and sent none
// would otherwise hold that much of the host's memory for each call it
// answered so, for as long as the call waits.
func readFrame(r io.Reader) (byte, []byte, error) {
	var h [5]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return 0, nil, err
	}
	n := int(binary.BigEndian.Uint32(h[1:]))
	if n > MaxFrame {
		return 0, nil, fmt.Errorf("%w: %d bytes", ErrFrameTooLarge, n)
	}
	p := make([]byte, 0, min(n, firstReadBytes))
	for len(p) < n {
		if len(p) == cap(p) {
			// Doubled, so a payload is copied about once in all.
			p = slices.Grow(p, min(n-len(p), len(p)))
		}
		m, err := io.ReadFull(r, p[len(p):min(cap(p), n)])
		p = p[:len(p)+m]
		if err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return 0, nil, err
		}
	}
	return h[0], p, nil
}

// writeChunks sends r as frameData frames of at most MaxFrame bytes.
func writeChunks(w io.Writer, kind byte, r io.Reader) (int64, error) {
	buf := make([]byte, 64<<10)
	var total int64
	for {
		n, err := r.Read(buf)
		if n > 0 {
			total += int64(n)
			if werr := writeFrame(w, kind, buf[:n]); werr != nil {
				return total, werr
			}
		}
		if err == io.EOF {
			return total, nil
		}
		if err != nil {
			return total, err
		}
	}
}
