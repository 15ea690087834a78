package naive

import (
	"sync"
	"time"
)

// Clock is the service's time: the real time plus an offset that Advance
// moves, so a lesson or a test can let ten minutes or two days pass at once.
type Clock struct {
	mu     sync.Mutex
	offset time.Duration
}

// Now is the service's present.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return time.Now().Add(c.offset)
}

// Advance moves the service's present on by d.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.offset += d
}

// ttlCache is what ExpiringCache trusts instead of the database: Redis's
// SET key value NX EX ttl, played by a map on the service's clock.
type ttlCache struct {
	ttl   time.Duration
	clock *Clock

	mu      sync.Mutex
	entries map[string]cacheEntry
}

type cacheEntry struct {
	reply   reply // Status 0 while the first request runs
	expires time.Time
}

// setNX claims key for ttl unless a live entry holds it, which it returns.
func (c *ttlCache) setNX(key string) (won bool, first *reply) {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.clock.Now()
	if e, ok := c.entries[key]; ok && now.Before(e.expires) {
		return false, &e.reply
	}
	c.entries[key] = cacheEntry{expires: now.Add(c.ttl)} // an expired entry is as good as none
	return true, nil
}

// put stores the reply under a key claimed earlier, keeping its expiry.
func (c *ttlCache) put(key string, r reply) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.entries[key]; ok {
		e.reply = r
		c.entries[key] = e
	}
}

func (c *ttlCache) del(key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.entries, key)
}

// DefaultWindow stands for the work real code does between its check and
// its insert (a stock check, a price lookup): CheckThenInsert's race lives
// in it, however short it is.
const DefaultWindow = 50 * time.Millisecond

// window is the time between CheckThenInsert's check and its insert.
func (s *Service) window() {
	s.mu.Lock()
	g := s.hold
	s.mu.Unlock()
	if g == nil {
		time.Sleep(DefaultWindow)
		return
	}
	g.wait()
}

// HoldWindowOpen holds the next n requests of CheckThenInsert between their
// check and their insert until all n are inside, or atMost after the first
// came in: the interleaving the race allows, made certain, so that a lesson
// or a test counts exactly. Without it the race is won by chance, more
// often under load.
func (s *Service) HoldWindowOpen(n int, atMost time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.hold = &gate{left: n, atMost: atMost, open: make(chan struct{})}
}

// gate lets its waiters go together once the last of them has arrived;
// once open, it stays open.
type gate struct {
	mu     sync.Mutex
	left   int
	atMost time.Duration
	timer  *time.Timer
	open   chan struct{}
	once   sync.Once
}

func (g *gate) wait() {
	g.mu.Lock()
	if g.timer == nil {
		g.timer = time.AfterFunc(g.atMost, g.release)
	}
	g.left--
	last := g.left == 0
	g.mu.Unlock()
	if last {
		g.release()
	}
	<-g.open
}

func (g *gate) release() { g.once.Do(func() { close(g.open) }) }
