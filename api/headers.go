package api

// LeaderHeader is a response header a server sets on an append
// (AppendEvents, AppendEventsBatch) that it forwarded to the leader: the
// leader's API URL. A client that writes a lot (a node daemon's
// client.Appender) sends its next appends there directly, which saves every
// append the follower's hop: a second RPC, and the follower's CPU for
// decoding and re-encoding it. Followers keep forwarding, so a client that
// ignores the header loses nothing but that hop.
const LeaderHeader = "Warren-Leader"
