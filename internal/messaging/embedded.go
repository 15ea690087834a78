package messaging

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// ServiceUser is the NATS user the order service itself connects as.
const ServiceUser = "orderservice"

// EmbeddedOptions configure the NATS server the service runs in-process
// when no NATS_URL is given.
type EmbeddedOptions struct {
	// Addr is host:port to listen on; port 0 lets the kernel choose.
	Addr string
	// StoreDir is where JetStream keeps its streams.
	StoreDir string
	// Tenants maps each tenant to its API key: one NATS user per tenant.
	Tenants map[string]string
	// ServicePassword is the password of ServiceUser.
	ServicePassword string
}

// Why an embedded server did not start: it could not listen on its
// address (another process holds it), or JetStream could not keep its
// store in its directory.
var (
	ErrEmbeddedListen = errors.New("the embedded NATS server cannot listen")
	ErrEmbeddedStore  = errors.New("the embedded NATS server cannot keep its JetStream store")
)

// Embedded is a running in-process NATS server with JetStream.
type Embedded struct {
	server *server.Server
}

// StartEmbedded starts a NATS server with JetStream and one user per
// tenant, whose permissions are the tenant's own subjects only (see
// TenantPermissions). The broker itself refuses a publish under another
// tenant's prefix, and a subscription to anything but the tenant's own.
func StartEmbedded(opts EmbeddedOptions) (*Embedded, error) {
	host, portText, err := net.SplitHostPort(opts.Addr)
	if err != nil {
		return nil, fmt.Errorf("NATS_EMBEDDED_ADDR %q: %w", opts.Addr, err)
	}
	port, err := strconv.Atoi(portText)
	if err != nil {
		return nil, fmt.Errorf("NATS_EMBEDDED_ADDR %q: port is not a number", opts.Addr)
	}
	if port == 0 {
		port = server.RANDOM_PORT
	} else if ln, err := net.Listen("tcp", opts.Addr); err != nil {
		// The server would only report it to a log and never be ready:
		// try the address first, for the reason.
		return nil, fmt.Errorf("%w on %s: %w", ErrEmbeddedListen, opts.Addr, err)
	} else {
		ln.Close()
	}
	if err := writable(opts.StoreDir); err != nil {
		return nil, fmt.Errorf("%w in %s: %w", ErrEmbeddedStore, opts.StoreDir, err)
	}
	users := []*server.User{{Username: ServiceUser, Password: opts.ServicePassword}}
	for tenant, key := range opts.Tenants {
		users = append(users, &server.User{Username: tenant, Password: key, Permissions: TenantPermissions(tenant)})
	}
	s, err := server.NewServer(&server.Options{
		ServerName: "orderservice-embedded", Host: host, Port: port,
		JetStream: true, StoreDir: opts.StoreDir, Users: users,
		NoSigs: true, NoLog: true, MaxPayload: 1 << 20,
	})
	if err != nil {
		return nil, fmt.Errorf("embedded NATS server: %w", err)
	}
	fatal := make(fatals, 1)
	s.SetLoggerV2(fatal, false, false, false)
	go s.Start()
	ready := make(chan bool, 1)
	go func() { ready <- s.ReadyForConnections(10 * time.Second) }()
	select {
	case ok := <-ready:
		if ok {
			return &Embedded{server: s}, nil
		}
		s.Shutdown()
		return nil, fmt.Errorf("embedded NATS server did not start listening on %s (store %s) within 10s", opts.Addr, opts.StoreDir)
	case msg := <-fatal: // the store refused, or another process took the address since it was tried
		s.Shutdown()
		return nil, fmt.Errorf("embedded NATS server on %s (store %s): %s", opts.Addr, opts.StoreDir, msg)
	}
}

// writable makes dir if it is missing and checks that a file can be
// written in it, as JetStream's store must.
func writable(dir string) error {
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return err
	}
	f, err := os.CreateTemp(dir, ".writable-*")
	if err != nil {
		return err
	}
	f.Close()
	return os.Remove(f.Name())
}

// fatals receives what the embedded server reports as fatal, where its own
// logger would exit the process; it stops there, and StartEmbedded returns
// the reason. The rest of its log is dropped.
type fatals chan string

func (f fatals) Fatalf(format string, v ...any) {
	select {
	case f <- fmt.Sprintf(format, v...):
	default:
	}
}
func (fatals) Noticef(string, ...any) {}
func (fatals) Warnf(string, ...any)   {}
func (fatals) Errorf(string, ...any)  {}
func (fatals) Debugf(string, ...any)  {}
func (fatals) Tracef(string, ...any)  {}

// TenantPermissions are what one tenant's NATS user may do, and nothing
// else: publish commands on its five operation subjects,
// orders.commands.<tenant>.<op> for each of Ops (not orders.commands.<tenant>.>:
// a subject the service could only refuse, an unknown operation, a token
// too many, one as long as the broker's control line, is refused by the
// broker before it takes a place in the stream), and subscribe to
// its own results, its own events and its own reply inbox (InboxPrefix),
// where JetStream sends the acknowledgement of each publish. Not to the
// shared _INBOX.>: the service's pull requests, JetStream API replies and
// operator's DLQ reads are answered there, so a tenant allowed it would
// read every tenant's commands as the service fetches them. Every tenant
// name is one subject token (IsToken), so no pattern here can match
// another tenant's subjects. The same list is in deploy/nats.conf for the
// compose setup (tests/deploytest's tests hold the two together).
func TenantPermissions(tenant string) *server.Permissions {
	commands := make([]string, 0, len(Ops))
	for _, op := range Ops {
		commands = append(commands, CommandSubject(tenant, op))
	}
	return &server.Permissions{
		Publish: &server.SubjectPermission{Allow: commands},
		Subscribe: &server.SubjectPermission{Allow: []string{
			ResultPrefix + tenant + ".>", EventPrefix + tenant + ".>", InboxPrefix(tenant) + ".>"}},
	}
}

// InboxPrefix is the reply inbox prefix a tenant's connection must use
// (nats.CustomInboxPrefix), the only inbox its permissions let it read.
func InboxPrefix(tenant string) string { return "_INBOX_" + tenant }

// URL is the address clients connect to, without credentials.
func (e *Embedded) URL() string { return e.server.ClientURL() }

// Addr is the host:port the server listens on.
func (e *Embedded) Addr() string { return e.server.Addr().String() }

// Close stops the server and waits until it has.
func (e *Embedded) Close() {
	e.server.Shutdown()
	e.server.WaitForShutdown()
}
