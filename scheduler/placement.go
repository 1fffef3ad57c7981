package scheduler

import (
	"fmt"
	"math/rand/v2"
)

// NodeStatus is a node's liveness as the scheduler last recorded it.
type NodeStatus int

const (
	// NodeStatusUnknown is the zero value; placement never uses such a node.
	NodeStatusUnknown NodeStatus = iota
	NodeReady
	NodeDown
	NodeDraining
)

func (s NodeStatus) String() string {
	switch s {
	case NodeReady:
		return "ready"
	case NodeDown:
		return "down"
	case NodeDraining:
		return "draining"
	}
	return "unknown"
}

// Resources is an amount of CPU (in thousandths of a core) and memory.
type Resources struct {
	MilliCPU    int64
	MemoryBytes int64
}

// PlacementNode is what placement reads about one node. Place never
// modifies it (nor its slices and maps).
type PlacementNode struct {
	ID       string
	Status   NodeStatus
	Eligible bool     // false when cordoned
	Drivers  []string // "sim", "microvm", "container"
	// Templates the node can run (has the image for).
	Templates []string
	// WarmTemplates is the number of warm sandboxes per template that the
	// node can hand out now (its last heartbeat's report; see warm.go).
	WarmTemplates map[string]int
	Capacity      Resources
	// Allocated is what tasks already on the node hold. It may exceed
	// Capacity (an over-committed snapshot); such a node fits nothing.
	Allocated Resources
	Labels    map[string]string
	// Starting is how many tasks placed here have not started yet.
	Starting int
}

// PendingTask is a task waiting for a node.
type PendingTask struct {
	ID       string // unique within one Place call
	Driver   string // required
	Template string // optional; when set the node must list it
	Needs    Resources
	// AvoidNode is the node the task just failed on: used only when no
	// other node fits.
	AvoidNode string
	// Labels the task requires of its node (a node selector): the node
	// must carry every key with the same value.
	Labels map[string]string
}

// Placement puts one task on one node. Warm reports that the plan counts
// on one of the node's warm sandboxes of the task's template.
type Placement struct {
	TaskID, NodeID string
	Warm           bool
}

// Plan is Place's result: the placements in task order, and for every task
// not placed the reason ("no node fits: 3 without driver microvm, 1 down").
// Unplaced is never nil.
type Plan struct {
	Placements []Placement
	Unplaced   map[string]string
	// Unfit counts the unplaced tasks no node could take even empty: none
	// passes their static filters (status, eligibility, driver, template,
	// labels) with the capacity they need, or the task itself is
	// malformed. The rest of Unplaced waited for room.
	Unfit int
}

// PlacementConfig tunes Place. The zero value is usable.
type PlacementConfig struct {
	// MaxStartingPerNode: a node with this many tasks starting (placed,
	// not yet running) takes no more until some start. 0 means no limit.
	// It spreads a burst of placements (a big submission, or a dead
	// node's tasks) over many nodes instead of packing one host with
	// starts it cannot absorb at once.
	MaxStartingPerNode int
	// SpreadLabel is the node label naming a failure domain ("zone").
	// Empty turns spreading off. Nodes without the label form one domain.
	SpreadLabel string
	// SampleAbove: when more nodes than this pass a task's static filters
	// (status, eligibility, driver, template, labels), Place scores a random
	// sample of SampleK fitting nodes instead of all of them ("power of K
	// choices"). It draws nodes without replacement until SampleK fit, at
	// most 4*SampleK draws; when that falls short (most nodes are full) it
	// checks every node, then samples SampleK of the fitting ones if there
	// are still more than SampleAbove, else scores them all. Default 256.
	SampleAbove int
	// SampleK is the sample size. Default 32: the best of 32 uniform draws
	// is in the top 10% of nodes with probability 1-0.9^32 ≈ 97% and in the
	// top 5% with ≈ 81%, while scoring 32 nodes costs about a microsecond.
	// Two things keep sampling from losing what matters most: warm nodes
	// are searched as their own tier (see the weights), so a rare warm node
	// is never missed; and the node that the previous task with the same
	// driver, template and labels went to joins every sample, so a run of
	// similar tasks fills one node before moving on (bin-packing) instead
	// of landing on K random ones.
	SampleK int
}

// Defaults for PlacementConfig's zero fields.
const (
	DefaultSampleAbove = 256
	DefaultSampleK     = 32
)

// Score weights. A candidate's score is
//
//	weightWarm*warm + weightSpread*spread + weightBinpack*binpack
//
// with each term in [0,1]:
//   - warm is 1 when the node has a free warm sandbox of the task's
//     template. weightWarm exceeds the other weights together, so a warm
//     node always outranks a cold one; Place therefore looks at the nodes
//     with free warm slots first (a tier), which is the same order and lets
//     a sample never miss a rare warm node.
//   - spread is (Lmax-L)/(Lmax-Lmin) over the candidates' failure domains,
//     where a domain's load L is its dominant share (max of CPU and memory)
//     of allocated plus planned resources over the capacity of its ready,
//     eligible nodes. The emptiest domain scores 1, the fullest 0; when all
//     are equal it is 1. Shares rather than task counts weigh both what runs
//     already and what this plan adds, and give bigger domains more work.
//     weightSpread exceeds weightBinpack so spreading wins between domains
//     and bin-packing decides within one.
//   - binpack is the node's mean used fraction of CPU and memory after
//     placing the task: fuller nodes first, leaving whole nodes free for
//     big tasks and for draining.
//
// AvoidNode acts as a penalty larger than all weights together: the node
// is used only when no other node fits. Ties go to the node earlier in the
// nodes slice.
const (
	weightWarm    = 4.0
	weightSpread  = 2.0
	weightBinpack = 1.0
)

// sampleTries bounds rejection sampling at sampleTries*SampleK draws. When
// fewer than a quarter or so of the listed nodes fit, it finds too few and
// Place scans the list instead, which is then the right cost anyway.
const sampleTries = 4

// Place assigns tasks to nodes, in the order given. It is pure: it reads a
// snapshot of the nodes (filled by the leader from the FSM) and returns a
// plan (which the leader commits through raft); it does no IO, reads no
// clock, and draws randomness only from rng, so a seed replays a run.
//
// A node is feasible for a task when it is ready, eligible, has the task's
// driver, its template (if named) and labels, and its free capacity
// (Capacity - Allocated - what this plan already put there) covers Needs.
// Among feasible nodes (or a sample of them, see PlacementConfig) the best
// score wins (see the weights above); each warm placement uses up one warm
// slot. A task without a template uses warm slots of DefaultTemplate,
// which its node claims for it. The plan never puts more on a node than
// its free capacity. A task no node takes is in Plan.Unplaced with the
// count of nodes each filter excluded. A repeated task ID is ignored after its first occurrence.
//
// rng drives sampling only; the same inputs and seed give the same plan. A
// nil rng means a fixed seed.
func Place(nodes []PlacementNode, tasks []PendingTask, cfg PlacementConfig, rng *rand.Rand) Plan {
	if cfg.SampleAbove <= 0 {
		cfg.SampleAbove = DefaultSampleAbove
	}
	if cfg.SampleK <= 0 {
		cfg.SampleK = DefaultSampleK
	}
	if rng == nil {
		rng = rand.New(rand.NewPCG(0, 0))
	}
	p := newPlacer(nodes, cfg, rng)
	plan := Plan{Unplaced: map[string]string{}}
	seen := make(map[string]struct{}, len(tasks))
	for ti := range tasks {
		t := &tasks[ti]
		if _, dup := seen[t.ID]; dup {
			continue
		}
		seen[t.ID] = struct{}{}
		node, warm, reason := p.place(t)
		if node < 0 {
			plan.Unplaced[t.ID] = reason
			if p.unfit(t) {
				plan.Unfit++
			}
			continue
		}
		plan.Placements = append(plan.Placements, Placement{TaskID: t.ID, NodeID: nodes[node].ID, Warm: warm})
	}
	return plan
}

// unfit reports whether no node could take t even empty: none passes its
// static filters with the capacity it needs, or t itself is malformed.
func (p *placer) unfit(t *PendingTask) bool {
	if t.Driver == "" || t.Needs.MilliCPU < 0 || t.Needs.MemoryBytes < 0 {
		return true
	}
	for _, i := range p.classFor(t).static {
		if p.capCPU[i] >= t.Needs.MilliCPU && p.capMem[i] >= t.Needs.MemoryBytes {
			return false
		}
	}
	return true
}

// placer is the working state of one Place call.
type placer struct {
	nodes            []PlacementNode
	cfg              PlacementConfig
	rng              *rand.Rand
	capCPU, capMem   []int64
	freeCPU, freeMem []int64
	startLeft        []int // per node, when MaxStartingPerNode is set
	// dom is each schedulable node's failure domain, or nil when spreading
	// is off; domUsed and domCap are per domain.
	dom             []int32
	domUsed, domCap []Resources
	warmLeft        map[string][]int32 // template -> free warm slots per node
	classes         map[nodeClassKey]*nodeClass
	byID            map[string]int // built on first use
	cands           []candidate    // scratch
}

type candidate struct {
	node int
	load float64 // the node's domain load
}

// nodeClassKey groups tasks that pass the same static filters. labels is
// selectorKey of the task's labels, which tells label sets apart.
type nodeClassKey struct {
	driver, template, labels string
}

// nodeClass is the static filtering of all nodes for one nodeClassKey,
// done once per Place call.
type nodeClass struct {
	key nodeClassKey
	// static lists the nodes passing the static filters; warm the subset
	// with a free warm slot of the template. Both are permuted by sampling,
	// and warm loses nodes as their slots run out.
	static, warm []int
	excluded     [numExclusions]int // nodes failing each static filter first
	last         int                // node of the class's latest placement, or -1
}

// exclusion names the filter a node fails, in the order checked.
type exclusion int

const (
	exclDown exclusion = iota
	exclDraining
	exclUnknown
	exclIneligible
	exclDriver
	exclTemplate
	exclLabels
	exclCapacity
	numExclusions
)

func newPlacer(nodes []PlacementNode, cfg PlacementConfig, rng *rand.Rand) *placer {
	n := len(nodes)
	p := &placer{
		nodes: nodes, cfg: cfg, rng: rng,
		capCPU: make([]int64, n), capMem: make([]int64, n),
		freeCPU: make([]int64, n), freeMem: make([]int64, n),
		warmLeft: map[string][]int32{},
		classes:  map[nodeClassKey]*nodeClass{},
	}
	for i := range nodes {
		nd := &nodes[i]
		p.capCPU[i], p.capMem[i] = nd.Capacity.MilliCPU, nd.Capacity.MemoryBytes
		p.freeCPU[i] = nd.Capacity.MilliCPU - nd.Allocated.MilliCPU
		p.freeMem[i] = nd.Capacity.MemoryBytes - nd.Allocated.MemoryBytes
	}
	if cfg.MaxStartingPerNode > 0 {
		p.startLeft = make([]int, n)
		for i := range nodes {
			p.startLeft[i] = cfg.MaxStartingPerNode - nodes[i].Starting
		}
	}
	if cfg.SpreadLabel != "" {
		p.dom = make([]int32, n)
		ids := map[string]int32{}
		for i := range nodes {
			nd := &nodes[i]
			if nd.Status != NodeReady || !nd.Eligible {
				p.dom[i] = -1
				continue
			}
			v := nd.Labels[cfg.SpreadLabel]
			d, ok := ids[v]
			if !ok {
				d = int32(len(p.domCap))
				ids[v] = d
				p.domCap = append(p.domCap, Resources{})
				p.domUsed = append(p.domUsed, Resources{})
			}
			p.dom[i] = d
			p.domCap[d].MilliCPU += nd.Capacity.MilliCPU
			p.domCap[d].MemoryBytes += nd.Capacity.MemoryBytes
			p.domUsed[d].MilliCPU += nd.Allocated.MilliCPU
			p.domUsed[d].MemoryBytes += nd.Allocated.MemoryBytes
		}
	}
	return p
}

// place picks a node for t, or returns -1 and the reason.
func (p *placer) place(t *PendingTask) (node int, warm bool, reason string) {
	if t.Driver == "" {
		return -1, false, "task names no driver"
	}
	if t.Needs.MilliCPU < 0 || t.Needs.MemoryBytes < 0 {
		return -1, false, "task needs negative resources"
	}
	c := p.classFor(t)
	avoid := -1
	if t.AvoidNode != "" {
		avoid = p.nodeIndex(t.AvoidNode)
	}
	wl := p.warmLeft[warmTemplate(t)] // set by classFor
	if len(c.warm) > 0 {
		if i := p.best(&c.warm, t, avoid, wl, c.last); i >= 0 {
			p.commit(i, t, wl)
			c.last = i
			return i, true, ""
		}
	}
	if i := p.best(&c.static, t, avoid, nil, c.last); i >= 0 {
		p.commit(i, t, nil)
		c.last = i
		return i, false, ""
	}
	// Last resort: the node the task failed on.
	if avoid >= 0 && p.check(avoid, t) == numExclusions && p.fits(avoid, t.Needs) {
		warm := wl != nil && wl[avoid] > 0
		if !warm {
			wl = nil
		}
		p.commit(avoid, t, wl)
		return avoid, warm, ""
	}
	return -1, false, p.reason(c, t)
}

// best returns the best feasible node in *list other than avoid, or -1.
// With wl set it considers only nodes with a free warm slot and drops
// those without one from *list (slots do not come back within a plan).
// A sample also includes last (the node the class's previous task went
// to) if it is feasible.
func (p *placer) best(list *[]int, t *PendingTask, avoid int, wl []int32, last int) int {
	l := *list
	k := p.cfg.SampleK
	p.cands = p.cands[:0]
	if len(l) > p.cfg.SampleAbove {
		// Draw without replacement (a partial Fisher-Yates shuffle of l)
		// until k nodes fit.
		j := 0
		for tries := 0; j < len(l) && tries < sampleTries*k && len(p.cands) < k; tries++ {
			r := j + p.rng.IntN(len(l)-j)
			l[j], l[r] = l[r], l[j]
			i := l[j]
			if wl != nil && wl[i] <= 0 {
				l[j] = l[len(l)-1]
				l = l[:len(l)-1]
				continue
			}
			j++
			if i != avoid && p.fits(i, t.Needs) {
				p.cands = append(p.cands, candidate{node: i})
			}
		}
		*list = l
		if len(p.cands) == k {
			p.addLast(last, t, avoid, wl)
			return p.choose(t, wl != nil)
		}
		p.cands = p.cands[:0]
	}
	n := 0
	for _, i := range l {
		if wl != nil && wl[i] <= 0 {
			continue
		}
		l[n] = i
		n++
		if i != avoid && p.fits(i, t.Needs) {
			p.cands = append(p.cands, candidate{node: i})
		}
	}
	*list = l[:n]
	if len(p.cands) > p.cfg.SampleAbove && len(p.cands) > k {
		for j := 0; j < k; j++ {
			r := j + p.rng.IntN(len(p.cands)-j)
			p.cands[j], p.cands[r] = p.cands[r], p.cands[j]
		}
		p.cands = p.cands[:k]
		p.addLast(last, t, avoid, wl)
	}
	return p.choose(t, wl != nil)
}

// addLast adds node last to a sample if it is feasible and not in it yet.
func (p *placer) addLast(last int, t *PendingTask, avoid int, wl []int32) {
	if last < 0 || last == avoid || !p.fits(last, t.Needs) || wl != nil && wl[last] <= 0 {
		return
	}
	for _, c := range p.cands {
		if c.node == last {
			return
		}
	}
	p.cands = append(p.cands, candidate{node: last})
}

// choose returns the highest-scoring node of p.cands, or -1 if empty.
func (p *placer) choose(t *PendingTask, warm bool) int {
	if len(p.cands) == 0 {
		return -1
	}
	var lo, hi float64
	if p.dom != nil {
		for j := range p.cands {
			l := p.domLoad(p.dom[p.cands[j].node])
			p.cands[j].load = l
			if j == 0 || l < lo {
				lo = l
			}
			if j == 0 || l > hi {
				hi = l
			}
		}
	}
	best, bestScore := -1, 0.0
	for _, c := range p.cands {
		s := weightBinpack * p.binpack(c.node, t.Needs)
		if hi > lo {
			s += weightSpread * (hi - c.load) / (hi - lo)
		} else if p.dom != nil {
			s += weightSpread
		}
		if warm {
			s += weightWarm
		}
		if best < 0 || s > bestScore || s == bestScore && c.node < best {
			best, bestScore = c.node, s
		}
	}
	return best
}

// binpack is node i's mean used fraction after adding need.
func (p *placer) binpack(i int, need Resources) float64 {
	var sum float64
	dims := 0
	if c := p.capCPU[i]; c > 0 {
		sum += float64(c-p.freeCPU[i]+need.MilliCPU) / float64(c)
		dims++
	}
	if c := p.capMem[i]; c > 0 {
		sum += float64(c-p.freeMem[i]+need.MemoryBytes) / float64(c)
		dims++
	}
	if dims == 0 {
		return 0
	}
	return sum / float64(dims)
}

// domLoad is domain d's dominant share.
func (p *placer) domLoad(d int32) float64 {
	u, c := p.domUsed[d], p.domCap[d]
	return max(shareOf(u.MilliCPU, c.MilliCPU), shareOf(u.MemoryBytes, c.MemoryBytes))
}

func shareOf(used, capacity int64) float64 {
	if capacity <= 0 {
		return 0
	}
	return float64(used) / float64(capacity)
}

func (p *placer) fits(i int, need Resources) bool {
	return need.MilliCPU <= p.freeCPU[i] && need.MemoryBytes <= p.freeMem[i] && (p.startLeft == nil || p.startLeft[i] > 0)
}

// commit records t on node i, using a warm slot when wl is set.
func (p *placer) commit(i int, t *PendingTask, wl []int32) {
	p.freeCPU[i] -= t.Needs.MilliCPU
	p.freeMem[i] -= t.Needs.MemoryBytes
	if p.startLeft != nil {
		p.startLeft[i]--
	}
	if p.dom != nil {
		d := p.dom[i]
		p.domUsed[d].MilliCPU += t.Needs.MilliCPU
		p.domUsed[d].MemoryBytes += t.Needs.MemoryBytes
	}
	if wl != nil {
		wl[i]--
	}
	if invariants {
		if p.freeCPU[i] < 0 || p.freeMem[i] < 0 {
			panic(fmt.Sprintf("invariant: task %s overcommits node %s (free cpu %d mem %d)", t.ID, p.nodes[i].ID, p.freeCPU[i], p.freeMem[i]))
		}
		if wl != nil && wl[i] < 0 {
			panic(fmt.Sprintf("invariant: task %s takes a warm %s slot node %s does not have", t.ID, warmTemplate(t), p.nodes[i].ID))
		}
	}
}

func (p *placer) nodeIndex(id string) int {
	if p.byID == nil {
		p.byID = make(map[string]int, len(p.nodes))
		for i := range p.nodes {
			if _, dup := p.byID[p.nodes[i].ID]; !dup {
				p.byID[p.nodes[i].ID] = i
			}
		}
	}
	if i, ok := p.byID[id]; ok {
		return i
	}
	return -1
}
