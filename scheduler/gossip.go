package scheduler

import (
	"github.com/warrenhq/warren/internal/gossip"
)

// startGossip joins memberlist as "server:ID"; the deaths of node daemons
// it reports feed the leader's liveness view.
func startGossip(s *Server) (*gossip.Member, error) {
	return gossip.Start(gossip.Config{
		Role: gossip.RoleServer, ID: s.cfg.ID, Addr: s.cfg.GossipAddr, Join: s.cfg.JoinGossip,
		Logger: s.log,
		OnChange: func(role, id string, alive bool) {
			if role != gossip.RoleNode {
				return
			}
			s.log.Info("memberlist", "node", id, "alive", alive)
			s.sess.gossip(id, !alive, s.clock.Now())
		},
	})
}
