// Package testproc runs the project's real binaries in tests (and in the
// benchmark, through Build, Launch, Stop and WaitOK): built once,
// started on free loopback ports with their output kept for a failing
// test, waited for, and stopped (SIGTERM) or killed as a crash would. It is
// the one process runner of the tests (the service's, the fault suite's,
// the deployment's).
package testproc

import (
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// Build compiles each package (an import path) into dir and returns the
// binaries by package.
func Build(dir string, pkgs ...string) (map[string]string, error) {
	bins := make(map[string]string, len(pkgs))
	for _, pkg := range pkgs {
		bin := filepath.Join(dir, filepath.Base(pkg))
		if out, err := exec.Command("go", "build", "-o", bin, pkg).CombinedOutput(); err != nil {
			return nil, fmt.Errorf("go build %s: %v\n%s", pkg, err, out)
		}
		bins[pkg] = bin
	}
	return bins, nil
}

// FreeAddr returns a loopback address nobody listened on a moment ago,
// and that no earlier call of this test binary returned.
func FreeAddr(t testing.TB) string {
	t.Helper()
	addr, err := Addr()
	if err != nil {
		t.Fatal(err)
	}
	return addr
}

// handedOut is every address Addr returned in this process. The kernel
// may give a port it just freed to the next listen on port 0, so two
// calls in a row can return the same address: a test that picks the
// addresses of two instances, then a channel's, would start the second
// instance on a port the channel already holds (seen in the fault suite:
// the instance exits, "address already in use", and the test's probes of
// it reach the channel).
var handedOut sync.Map

// Addr is FreeAddr outside a test: it returns its error.
func Addr() (string, error) {
	for range 100 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return "", err
		}
		addr := ln.Addr().String()
		ln.Close()
		if _, given := handedOut.LoadOrStore(addr, true); !given {
			return addr, nil
		}
	}
	return "", fmt.Errorf("no loopback port that was not handed out before in 100 tries")
}

// Process is a running binary whose output goes to a log file, shown when
// the test fails.
type Process struct {
	Name string
	Cmd  *exec.Cmd
	// Done is closed once the process has exited.
	Done    chan struct{}
	log     string
	waitErr error
}

var seq atomic.Int64

// Start runs bin with exactly env and kills it when the test ends. It may
// be called from any goroutine: it returns its error instead of failing.
func Start(t testing.TB, name, bin string, env []string) (*Process, error) {
	logPath := filepath.Join(t.TempDir(), fmt.Sprintf("%s-%d.log", name, seq.Add(1)))
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin)
	cmd.Env, cmd.Stdout, cmd.Stderr = env, logFile, logFile
	p, err := Launch(name, cmd)
	logFile.Close() // the child has its own descriptor
	if err != nil {
		return nil, err
	}
	p.log = logPath
	t.Cleanup(func() {
		p.Kill(t)
		if t.Failed() {
			out, _ := os.ReadFile(logPath)
			if len(out) > 8<<10 {
				out = append([]byte("…"), out[len(out)-8<<10:]...)
			}
			t.Logf("%s output (%s):\n%s", name, logPath, out)
		}
	})
	return p, nil
}

// Launch starts cmd, set up by the caller, and watches it exit: Start
// without a test, for a program that runs a binary itself (tests/bench).
func Launch(name string, cmd *exec.Cmd) (*Process, error) {
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &Process{Name: name, Cmd: cmd, Done: make(chan struct{})}
	go func() {
		p.waitErr = cmd.Wait()
		close(p.Done)
	}()
	return p, nil
}

// Kill sends SIGKILL, as a crash would, and waits for the process to go.
func (p *Process) Kill(t testing.TB) {
	t.Helper()
	if p.Exited() {
		return
	}
	_ = p.Cmd.Process.Kill()
	select {
	case <-p.Done:
	case <-time.After(10 * time.Second):
		t.Errorf("%s did not die after SIGKILL", p.Name)
	}
}

// Exited reports whether the process has ended.
func (p *Process) Exited() bool {
	select {
	case <-p.Done:
		return true
	default:
		return false
	}
}

// Env turns a variable map (a compose service's environment) into the
// exact environment Start takes.
func Env(vars map[string]string) []string {
	env := make([]string, 0, len(vars))
	for k, v := range vars {
		env = append(env, k+"="+v)
	}
	return env
}

// Stop sends SIGTERM, as docker compose stop or an orchestrator does, and
// waits up to within for the process to exit. It returns how it exited (nil
// for status 0), or that it did not.
func (p *Process) Stop(within time.Duration) error {
	if err := p.Cmd.Process.Signal(syscall.SIGTERM); err != nil {
		return fmt.Errorf("SIGTERM %s: %w", p.Name, err)
	}
	select {
	case <-p.Done:
		if p.waitErr != nil {
			return fmt.Errorf("%s exited with %v after SIGTERM, want status 0", p.Name, p.waitErr)
		}
		return nil
	case <-time.After(within):
		return fmt.Errorf("%s still running %s after SIGTERM", p.Name, within)
	}
}

// WaitOK waits until url answers 200, or returns why it did not in time;
// it gives up at once if the process exits first.
func (p *Process) WaitOK(url string, within time.Duration) error {
	return waitOK(url, within, p)
}

// WaitOK waits until url answers 200, or returns why it did not in time.
func WaitOK(url string, within time.Duration) error { return waitOK(url, within, nil) }

func waitOK(url string, within time.Duration, p *Process) error {
	client := &http.Client{Timeout: time.Second}
	deadline := time.Now().Add(within)
	for {
		res, err := client.Get(url)
		if err == nil {
			res.Body.Close()
			if res.StatusCode == http.StatusOK {
				return nil
			}
			err = fmt.Errorf("status %d", res.StatusCode)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s did not answer 200 within %s (last: %v)", url, within, err)
		}
		if p != nil && p.Exited() {
			return fmt.Errorf("%s exited before %s answered 200: %v", p.Name, url, p.waitErr)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
