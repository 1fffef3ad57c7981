package scheduler

import "math/bits"

// reqSet is one task's set of request-id hashes (reqIndex): every hash
// noted, in order, and a blocked Bloom filter over them. Nearly every
// lookup is of a new request id, and the filter answers it from one
// 64-byte block. A Go map answered it from a slot anywhere in a table of
// about 20 bytes a hash; with thousands of hashes per live task that was
// a cache miss per append, and the lookup was 8% of a follower's CPU at
// 1024 writers. The filter takes 2 bytes a hash and the list 8, and only a
// filter hit (a retry, or about 1 in 3,000 new ids) scans the list, so the
// answers are exactly a hash set's.
type reqSet struct {
	hashes []uint64
	// filter holds blocks of 8 words; a hash sets filterProbes bits of
	// the block it picks. It is rebuilt twice the size when the list
	// outgrows filterBitsPerHash bits a hash.
	filter []uint64
}

const (
	filterBitsPerHash = 16
	filterProbes      = 8
	filterBlockWords  = 8
)

// has reports whether h was added.
func (s *reqSet) has(h uint64) bool {
	if len(s.filter) == 0 || !s.maybe(h) {
		return false
	}
	for _, x := range s.hashes {
		if x == h {
			return true
		}
	}
	return false
}

// add adds h. Adding the last hash again (an append's second event) is
// free.
func (s *reqSet) add(h uint64) {
	if n := len(s.hashes); n > 0 && s.hashes[n-1] == h {
		return
	}
	s.hashes = append(s.hashes, h)
	if len(s.hashes)*filterBitsPerHash <= len(s.filter)*64 {
		s.set(h)
		return
	}
	blocks := max(1, 2*len(s.filter)/filterBlockWords)
	for blocks*filterBlockWords*64 < len(s.hashes)*filterBitsPerHash {
		blocks *= 2
	}
	s.filter = make([]uint64, blocks*filterBlockWords)
	for _, x := range s.hashes {
		s.set(x)
	}
}

// block is the block h's bits go in: the high bits of h scaled to the
// block count (h comes from maphash, so every bit is mixed).
func (s *reqSet) block(h uint64) []uint64 {
	i, _ := bits.Mul64(h, uint64(len(s.filter)/filterBlockWords))
	i *= filterBlockWords
	return s.filter[i : i+filterBlockWords : i+filterBlockWords]
}

// probe is the i-th bit (of 512) that h sets in its block, taken from
// another mix of h than the one that picked the block.
func probe(g uint64, i int) uint64 { return (g >> (i * 8)) & (filterBlockWords*64 - 1) }

func mixProbes(h uint64) uint64 { return h * 0x9e3779b97f4a7c15 }

func (s *reqSet) set(h uint64) {
	b, g := s.block(h), mixProbes(h)
	for i := range filterProbes {
		p := probe(g, i)
		b[p/64] |= 1 << (p % 64)
	}
}

func (s *reqSet) maybe(h uint64) bool {
	b, g := s.block(h), mixProbes(h)
	for i := range filterProbes {
		p := probe(g, i)
		if b[p/64]&(1<<(p%64)) == 0 {
			return false
		}
	}
	return true
}
