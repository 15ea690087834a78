//go:build ha

package hatest

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// pgBinDir holds the PostgreSQL 15 binaries Debian installs.
const pgBinDir = "/usr/lib/postgresql/15/bin"

// cluster is etcd and two Patroni nodes under one temporary folder.
type cluster struct {
	dir   string
	cred  *syscall.Credential // the postgres user when we run as root
	etcd  *proc
	nodes []*node
	http  *http.Client
	mu    sync.Mutex
}

// node is one Patroni member and the PostgreSQL it manages.
type node struct {
	name    string
	pgAddr  string // where its PostgreSQL listens
	apiURL  string // its Patroni REST API
	config  string
	dataDir string
	patroni *proc
}

// proc is a process we started, in its own process group.
type proc struct {
	name string
	cmd  *exec.Cmd
	done chan struct{}
}

func (p *proc) running() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// freePort returns a loopback port nobody listened on a moment ago.
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

func freePorts(n int) ([]int, error) {
	ports := make([]int, n)
	seen := map[int]bool{}
	for i := range ports {
		for {
			p, err := freePort()
			if err != nil {
				return nil, err
			}
			if !seen[p] {
				seen[p], ports[i] = true, p
				break
			}
		}
	}
	return ports, nil
}

// checkTools says which packages are missing, so the failure names the fix.
func checkTools() error {
	var missing []string
	for bin, pkg := range map[string]string{"patroni": "patroni", "patronictl": "patroni", "etcd": "etcd-server",
		"etcdctl": "etcd-client", filepath.Join(pgBinDir, "postgres"): "postgresql-15"} {
		if _, err := exec.LookPath(bin); err != nil {
			missing = append(missing, pkg+" ("+bin+")")
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("the HA suite needs %s: run `make test-ha`, which installs them with apt-get", strings.Join(missing, ", "))
	}
	return nil
}

// startCluster bootstraps etcd and both nodes and waits until a primary
// and its synchronous standby run.
func startCluster(dir string) (*cluster, error) {
	if err := checkTools(); err != nil {
		return nil, err
	}
	c := &cluster{dir: dir, http: &http.Client{Timeout: 2 * time.Second}}
	if os.Geteuid() == 0 { // PostgreSQL refuses to run as root
		u, err := user.Lookup("postgres")
		if err != nil {
			return nil, fmt.Errorf("running as root, the cluster needs the postgres user: %w", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		c.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
	}
	ports, err := freePorts(6)
	if err != nil {
		return nil, err
	}
	etcdClient, etcdPeer := ports[0], ports[1]
	for i := range 2 {
		name := fmt.Sprintf("node%d", i+1)
		n := &node{name: name, pgAddr: fmt.Sprintf("127.0.0.1:%d", ports[2+2*i]),
			apiURL: fmt.Sprintf("http://127.0.0.1:%d", ports[3+2*i]),
			config: filepath.Join(dir, name+".yml"), dataDir: filepath.Join(dir, name, "data")}
		if err := os.MkdirAll(filepath.Join(dir, name), 0o700); err != nil {
			return nil, err
		}
		if err := os.WriteFile(n.config, []byte(patroniConfig(dir, n, etcdClient)), 0o600); err != nil {
			return nil, err
		}
		c.nodes = append(c.nodes, n)
	}
	if err := os.MkdirAll(filepath.Join(dir, "etcd"), 0o700); err != nil {
		return nil, err
	}
	if err := c.chown(); err != nil {
		return nil, err
	}

	peer := fmt.Sprintf("http://127.0.0.1:%d", etcdPeer)
	client := fmt.Sprintf("http://127.0.0.1:%d", etcdClient)
	c.etcd, err = c.start("etcd", "etcd", "--name", "ha", "--data-dir", filepath.Join(dir, "etcd", "data"),
		"--listen-client-urls", client, "--advertise-client-urls", client,
		"--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer, "--initial-cluster", "ha="+peer)
	if err != nil {
		return c, err
	}
	if err := c.waitFor(30*time.Second, "etcd healthy", func() error {
		res, err := c.http.Get(client + "/health")
		if err != nil {
			return err
		}
		res.Body.Close()
		if res.StatusCode != http.StatusOK {
			return errors.New(res.Status)
		}
		return nil
	}); err != nil {
		return c, err
	}
	for _, n := range c.nodes {
		if err := c.startNode(n); err != nil {
			return c, err
		}
	}
	return c, c.waitHealthy(90 * time.Second)
}

// patroniConfig is a node's configuration. A short ttl makes failover
// quick (Patroni needs loop_wait + 2*retry_timeout <= ttl);
// synchronous_mode makes every acknowledged commit durable on the standby
// that will be promoted.
func patroniConfig(dir string, n *node, etcdPort int) string {
	_, pgPort, _ := net.SplitHostPort(n.pgAddr)
	apiHostPort := strings.TrimPrefix(n.apiURL, "http://")
	return fmt.Sprintf(`scope: orderservice-ha
name: %[1]s
restapi:
  listen: %[2]s
  connect_address: %[2]s
etcd3:
  hosts: 127.0.0.1:%[3]d
bootstrap:
  dcs:
    ttl: 8
    loop_wait: 1
    retry_timeout: 3
    maximum_lag_on_failover: 1048576
    synchronous_mode: true
    postgresql:
      use_pg_rewind: true
      use_slots: true
      parameters:
        wal_log_hints: "on"
        max_connections: 200
        wal_keep_size: 128MB
        synchronous_commit: "on"
  initdb:
    - encoding: UTF8
    - data-checksums
  pg_hba:
    - host replication replicator 127.0.0.1/32 trust
    - host all all 127.0.0.1/32 trust
    - local all all trust
postgresql:
  listen: 127.0.0.1:%[4]s
  connect_address: 127.0.0.1:%[4]s
  data_dir: %[5]s
  bin_dir: %[6]s
  pgpass: %[7]s
  authentication:
    replication: {username: replicator, password: replicator}
    superuser: {username: postgres, password: postgres}
  parameters:
    unix_socket_directories: %[8]s
    fsync: "off"
`, n.name, apiHostPort, etcdPort, pgPort, n.dataDir, pgBinDir,
		filepath.Join(dir, n.name, "pgpass"), filepath.Join(dir, n.name))
}

func (c *cluster) chown() error {
	if c.cred == nil {
		return nil
	}
	return filepath.Walk(c.dir, func(path string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(path, int(c.cred.Uid), int(c.cred.Gid))
	})
}

// start runs a process as the cluster's user, in its own process group,
// its output appended to <dir>/<name>.log, its pid to <dir>/pids (so the
// Makefile can kill leftovers of a test binary that died).
func (c *cluster) start(name, bin string, args ...string) (*proc, error) {
	logFile, err := os.OpenFile(filepath.Join(c.dir, name+".log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Dir = c.dir
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.Env = append(os.Environ(), "HOME="+c.dir, "PYTHONUNBUFFERED=1")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Credential: c.cred, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, done: make(chan struct{})}
	c.recordPID(cmd.Process.Pid)
	go func() {
		_ = cmd.Wait()
		logFile.Close()
		close(p.done)
	}()
	return p, nil
}

func (c *cluster) recordPID(pid int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	f, err := os.OpenFile(filepath.Join(c.dir, "pids"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err == nil {
		fmt.Fprintln(f, pid)
		f.Close()
	}
}

func (c *cluster) startNode(n *node) error {
	p, err := c.start(n.name, "patroni", n.config)
	if err != nil {
		return err
	}
	n.patroni = p
	return nil
}

// member is one entry of Patroni's GET /cluster.
type member struct {
	Name  string `json:"name"`
	Role  string `json:"role"` // leader, sync_standby, replica
	State string `json:"state"`
	Host  string `json:"host"`
	Port  int    `json:"port"`
	Lag   any    `json:"lag"`
}

// members asks any live node's REST API for the cluster as Patroni sees it.
func (c *cluster) members() ([]member, error) {
	var lastErr error
	for _, n := range c.nodes {
		if n.patroni == nil || !n.patroni.running() {
			continue
		}
		res, err := c.http.Get(n.apiURL + "/cluster")
		if err != nil {
			lastErr = err
			continue
		}
		var body struct {
			Members []member `json:"members"`
		}
		err = json.NewDecoder(res.Body).Decode(&body)
		res.Body.Close()
		if err != nil {
			lastErr = err
			continue
		}
		return body.Members, nil
	}
	if lastErr == nil {
		lastErr = errors.New("no Patroni node runs")
	}
	return nil, lastErr
}

// leader is the node Patroni reports as the running leader.
func (c *cluster) leader() (*node, error) {
	ms, err := c.members()
	if err != nil {
		return nil, err
	}
	for _, m := range ms {
		if m.Role == "leader" && m.State == "running" {
			return c.node(m.Name), nil
		}
	}
	return nil, errors.New("no running leader")
}

func (c *cluster) node(name string) *node {
	for _, n := range c.nodes {
		if n.name == name {
			return n
		}
	}
	return nil
}

func (c *cluster) other(n *node) *node {
	for _, o := range c.nodes {
		if o != n {
			return o
		}
	}
	return nil
}

// isPrimary reports whether Patroni on n answers GET /primary with 200:
// n holds the leader lock and its PostgreSQL accepts writes.
func (c *cluster) isPrimary(n *node) bool {
	res, err := c.http.Get(n.apiURL + "/primary")
	if err != nil {
		return false
	}
	res.Body.Close()
	return res.StatusCode == http.StatusOK
}

// waitHealthy restarts nodes whose Patroni is down and waits until a leader
// runs and the other node is its synchronous standby with no lag: the state
// in which an acknowledged commit survives a failover.
func (c *cluster) waitHealthy(within time.Duration) error {
	for _, n := range c.nodes {
		if n.patroni == nil || !n.patroni.running() {
			if err := c.startNode(n); err != nil {
				return err
			}
		}
	}
	return c.waitFor(within, "a leader with a synchronous standby", func() error {
		ms, err := c.members()
		if err != nil {
			return err
		}
		var leader, sync bool
		for _, m := range ms {
			leader = leader || (m.Role == "leader" && m.State == "running")
			lag, isNum := m.Lag.(float64)
			sync = sync || (m.Role == "sync_standby" && (m.State == "running" || m.State == "streaming") && isNum && lag == 0)
		}
		if !leader || !sync || len(ms) != len(c.nodes) {
			return fmt.Errorf("members %+v", ms)
		}
		return nil
	})
}

func (c *cluster) waitFor(within time.Duration, what string, check func() error) error {
	deadline := time.Now().Add(within)
	for {
		err := check()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no %s within %s: %v", what, within, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// crash stops node n as a power cut would: Patroni, its postmaster and
// every backend are frozen first (SIGSTOP, so none of them acts on the
// others' death) and then SIGKILLed. Patroni starts PostgreSQL detached
// (its own session), so killing Patroni's process group alone would leave
// PostgreSQL running; killing only the postmaster would make Patroni
// restart it in place instead of failing over.
func (c *cluster) crash(n *node) error { return c.crasher(n)() }

// crasher finds n's processes now and returns the function that crashes
// them, so that the kill itself lands within microseconds when called.
func (c *cluster) crasher(n *node) func() error {
	var pids []int
	if n.patroni != nil && n.patroni.running() {
		pids = append(pids, n.patroni.cmd.Process.Pid)
	}
	if pm, ok := postmasterPID(n.dataDir); ok {
		pids = append(pids, pm)
		pids = append(pids, childrenOf(pm)...)
	}
	return func() error {
		for _, sig := range []syscall.Signal{syscall.SIGSTOP, syscall.SIGKILL} {
			for _, pid := range pids {
				_ = syscall.Kill(pid, sig)
			}
		}
		if n.patroni != nil {
			select {
			case <-n.patroni.done:
			case <-time.After(10 * time.Second):
				return fmt.Errorf("%s's Patroni did not die", n.name)
			}
		}
		return c.waitFor(10*time.Second, n.name+"'s PostgreSQL gone", func() error {
			for _, pid := range pids {
				if alive(pid) {
					return fmt.Errorf("pid %d alive", pid)
				}
			}
			return nil
		})
	}
}

// switchover asks Patroni for a planned switchover to candidate.
func (c *cluster) switchover(ctx context.Context, from, to *node) (string, error) {
	cmd := exec.CommandContext(ctx, "patronictl", "-c", from.config, "switchover",
		"--leader", from.name, "--candidate", to.name, "--force")
	cmd.Dir = c.dir
	cmd.Env = append(os.Environ(), "HOME="+c.dir)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: c.cred}
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// close kills everything the cluster started and checks nothing is left.
func (c *cluster) close() error {
	for _, n := range c.nodes {
		_ = c.crash(n)
	}
	if c.etcd != nil && c.etcd.running() {
		_ = syscall.Kill(-c.etcd.cmd.Process.Pid, syscall.SIGKILL)
		<-c.etcd.done
	}
	if left := processesUnder(c.dir); len(left) > 0 {
		for _, pid := range left {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		return fmt.Errorf("processes still ran under %s after the cluster stopped (killed now): %v", c.dir, left)
	}
	return nil
}

// logTail is the end of a cluster log, for a failing run.
func (c *cluster) logTail(name string, lines int) string {
	b, err := os.ReadFile(filepath.Join(c.dir, name+".log"))
	if err != nil {
		return err.Error()
	}
	all := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(all) > lines {
		all = all[len(all)-lines:]
	}
	return strings.Join(all, "\n")
}

func postmasterPID(dataDir string) (int, bool) {
	f, err := os.Open(filepath.Join(dataDir, "postmaster.pid"))
	if err != nil {
		return 0, false
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	if !s.Scan() {
		return 0, false
	}
	pid, err := strconv.Atoi(strings.TrimSpace(s.Text()))
	return pid, err == nil && alive(pid)
}

// procStat reads a process's state and parent from /proc.
func procStat(pid int) (state byte, ppid int, ok bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, 0, false
	}
	// pid (comm) state ppid ...; comm may hold spaces and parentheses.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 || i+4 > len(s) {
		return 0, 0, false
	}
	fields := strings.Fields(s[i+1:])
	if len(fields) < 2 {
		return 0, 0, false
	}
	ppid, _ = strconv.Atoi(fields[1])
	return fields[0][0], ppid, true
}

func alive(pid int) bool {
	state, _, ok := procStat(pid)
	return ok && state != 'Z' && state != 'X'
}

func childrenOf(parent int) []int {
	entries, _ := os.ReadDir("/proc")
	var kids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if _, ppid, ok := procStat(pid); ok && ppid == parent && alive(pid) {
			kids = append(kids, pid)
		}
	}
	return kids
}

// processesUnder lists live processes whose command line names dir.
func processesUnder(dir string) []int {
	entries, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err == nil && strings.Contains(string(cmdline), dir) && alive(pid) {
			pids = append(pids, pid)
		}
	}
	return pids
}
