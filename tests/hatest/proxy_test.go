//go:build ha

package hatest

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"regexp"
	"strings"
	"sync"
)

// pgProxy is the network between the service and one PostgreSQL node. It
// forwards bytes both ways, reads the frontend's messages to know which SQL
// reaches the node, can be cut (the node unreachable), and can trap one
// COMMIT: hold it between "sent by the service" and "answer read".
type pgProxy struct {
	ln     net.Listener
	target string

	mu         sync.Mutex
	down       bool
	conns      map[*proxyConn]struct{}
	statements []string
	inDoubt    [][]string // per COMMIT the server got whose answer never reached the service: the keys its transaction carried
	trap       *commitTrap
	wg         sync.WaitGroup
}

// trapMode is where a trapped COMMIT stops.
type trapMode int

const (
	// dropCommit: the COMMIT is lost on the way; the server never sees it.
	dropCommit trapMode = iota
	// holdReply: the server gets the COMMIT and answers; the answer is held,
	// so the commit is durable but the service does not know it.
	holdReply
	// raceKill: the server gets the COMMIT; the answer is held, and the test
	// kills the node at once, racing the commit's replication.
	raceKill
)

func (m trapMode) String() string {
	return [...]string{"COMMIT lost before the server", "COMMIT answered, answer held", "COMMIT sent, node killed at once"}[m]
}

// commitTrap catches the first COMMIT of a transaction that inserted an
// order, once.
type commitTrap struct {
	mode    trapMode
	caught  chan struct{} // closed when the COMMIT is in the trap
	replied chan struct{} // closed when the server's answer to it arrived (holdReply, raceKill)
	release chan struct{} // closed by the test: cut the connection, the answer unread
	once    sync.Once
}

func newCommitTrap(mode trapMode) *commitTrap {
	return &commitTrap{mode: mode, caught: make(chan struct{}), replied: make(chan struct{}), release: make(chan struct{})}
}

func newPGProxy(target string) (*pgProxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &pgProxy{ln: ln, target: target, conns: map[*proxyConn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

func (p *pgProxy) addr() string { return p.ln.Addr().String() }

func (p *pgProxy) close() {
	p.ln.Close()
	p.setDown(true)
	p.wg.Wait()
}

// setDown makes the node unreachable (new connections are closed at once,
// open ones are cut) or reachable again.
func (p *pgProxy) setDown(down bool) {
	p.mu.Lock()
	p.down = down
	var cut []*proxyConn
	if down {
		for c := range p.conns {
			cut = append(cut, c)
		}
	}
	p.mu.Unlock()
	for _, c := range cut {
		c.close()
	}
}

// arm sets a trap for the next COMMIT of a transaction that inserted an order.
func (p *pgProxy) arm(t *commitTrap) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.trap = t
}

// commitsInDoubt returns the COMMITs that reached the node whose answer the
// service never got (each as the keys its transaction bound), and forgets them.
func (p *pgProxy) commitsInDoubt() [][]string {
	p.mu.Lock()
	defer p.mu.Unlock()
	d := p.inDoubt
	p.inDoubt = nil
	return d
}

// seen returns the SQL that reached the node through the proxy, and forgets it.
func (p *pgProxy) seen() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := p.statements
	p.statements = nil
	return s
}

func (p *pgProxy) accept() {
	defer p.wg.Done()
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		down := p.down
		p.mu.Unlock()
		if down {
			client.Close()
			continue
		}
		server, err := net.Dial("tcp", p.target)
		if err != nil {
			client.Close()
			continue
		}
		c := &proxyConn{p: p, client: client, server: server, prepared: map[string]string{}}
		p.mu.Lock()
		p.conns[c] = struct{}{}
		p.mu.Unlock()
		p.wg.Add(2)
		go c.frontend()
		go c.backend()
	}
}

// proxyConn is one proxied connection.
type proxyConn struct {
	p              *pgProxy
	client, server net.Conn
	closeOnce      sync.Once

	mu         sync.Mutex
	prepared   map[string]string // statement name -> SQL (extended protocol)
	inserted   bool              // the open transaction inserted an order
	holding    *commitTrap       // the server's answers are held for this trap
	heldBytes  int
	committing bool     // a COMMIT went to the server and no answer came back yet
	txKeys     []string // UUID-shaped text parameters bound in the open transaction (idempotency keys among them)
}

// uuidText matches a UUID in text form, as the load's idempotency keys are.
var uuidText = regexp.MustCompile(`[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}`)

func (c *proxyConn) close() {
	c.closeOnce.Do(func() {
		c.client.Close()
		c.server.Close()
		c.mu.Lock()
		inDoubt := c.committing || c.holding != nil
		keys := c.txKeys
		c.mu.Unlock()
		c.p.mu.Lock()
		delete(c.p.conns, c)
		if inDoubt {
			c.p.inDoubt = append(c.p.inDoubt, keys)
		}
		c.p.mu.Unlock()
	})
}

func (c *proxyConn) record(sql string) {
	c.p.mu.Lock()
	c.p.statements = append(c.p.statements, sql)
	c.p.mu.Unlock()
}

// frontend copies the service's messages to the server, one at a time.
func (c *proxyConn) frontend() {
	defer c.p.wg.Done()
	defer c.close()
	// The startup message has no type byte: a length, then the payload.
	var lenBuf [4]byte
	if _, err := io.ReadFull(c.client, lenBuf[:]); err != nil {
		return
	}
	n := int(binary.BigEndian.Uint32(lenBuf[:]))
	if n < 4 || n > 1<<16 {
		return
	}
	startup := make([]byte, n)
	copy(startup, lenBuf[:])
	if _, err := io.ReadFull(c.client, startup[4:]); err != nil {
		return
	}
	if _, err := c.server.Write(startup); err != nil {
		return
	}
	for {
		var head [5]byte
		if _, err := io.ReadFull(c.client, head[:]); err != nil {
			return
		}
		size := int(binary.BigEndian.Uint32(head[1:]))
		if size < 4 || size > 64<<20 {
			return
		}
		msg := make([]byte, 5+size-4)
		copy(msg, head[:])
		if _, err := io.ReadFull(c.client, msg[5:]); err != nil {
			return
		}
		if trap := c.inspect(head[0], msg[5:]); trap != nil {
			c.spring(trap, msg)
			return
		}
		if _, err := c.server.Write(msg); err != nil {
			return
		}
	}
}

// inspect records the SQL of a Query, Parse or Bind message and returns the
// armed trap when msg is the COMMIT it waits for.
func (c *proxyConn) inspect(typ byte, body []byte) *commitTrap {
	var sql string
	switch typ {
	case 'Q': // Query: the SQL text
		sql, _ = cstring(body)
	case 'P': // Parse: statement name, SQL text, ...
		name, rest := cstring(body)
		text, _ := cstring(rest)
		c.mu.Lock()
		c.prepared[name] = text
		c.mu.Unlock()
		return nil // recorded when it is bound and run
	case 'B': // Bind: portal name, statement name, parameters
		_, rest := cstring(body)
		name, params := cstring(rest)
		c.mu.Lock()
		sql = c.prepared[name]
		c.txKeys = append(c.txKeys, uuidText.FindAllString(string(params), -1)...)
		c.mu.Unlock()
	default:
		return nil
	}
	c.record(sql)
	lower := strings.ToLower(strings.TrimSpace(sql))
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case strings.HasPrefix(lower, `insert into "orders"`):
		c.inserted = true
	case lower == "commit":
		inserted := c.inserted
		c.inserted = false
		c.committing = true
		if !inserted {
			return nil
		}
		c.p.mu.Lock()
		trap := c.p.trap
		c.p.trap = nil
		c.p.mu.Unlock()
		return trap
	case lower == "rollback" || lower == "begin":
		c.inserted, c.txKeys = false, nil
	}
	return nil
}

// spring holds the connection in the trap until the test releases it, then
// cuts it with the server's answer (if any) unread by the service.
func (c *proxyConn) spring(trap *commitTrap, commit []byte) {
	c.mu.Lock()
	c.committing = trap.mode != dropCommit
	c.mu.Unlock()
	if trap.mode != dropCommit {
		c.mu.Lock()
		c.holding = trap
		c.mu.Unlock()
		if _, err := c.server.Write(commit); err != nil {
			return
		}
	}
	close(trap.caught)
	<-trap.release
}

// backend copies the server's answers to the service, unless they are held.
func (c *proxyConn) backend() {
	defer c.p.wg.Done()
	defer c.close()
	buf := make([]byte, 32<<10)
	for {
		n, err := c.server.Read(buf)
		if n > 0 {
			c.mu.Lock()
			trap := c.holding
			if trap != nil {
				c.heldBytes += n
			} else {
				c.committing = false // the answer to the COMMIT, if one was pending
			}
			c.mu.Unlock()
			if trap != nil {
				// 'C' CommandComplete for the COMMIT: the commit is done
				// (and, with synchronous replication, on the standby).
				if buf[0] == 'C' {
					trap.once.Do(func() { close(trap.replied) })
				}
				continue
			}
			if _, werr := c.client.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				return
			}
			return
		}
	}
}

func cstring(b []byte) (string, []byte) {
	i := bytes.IndexByte(b, 0)
	if i < 0 {
		return string(b), nil
	}
	return string(b[:i]), b[i+1:]
}
