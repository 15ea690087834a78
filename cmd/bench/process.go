package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	"github.com/orderservice/orderservice/internal/app"
)

// serviceProcess is the service's own binary running beside the bench: the
// overload's service, so that the load generator's goroutines and garbage
// collector do not share the service's scheduler, as they do in this
// process. An open loop at three times capacity starts thousands of
// requests a second; in one process, each answer would wait behind them.
type serviceProcess struct {
	url    string
	config app.Config
	cmd    *exec.Cmd
	done   chan struct{}
	output bytes.Buffer // what it printed, for an error
}

// buildService compiles cmd/orderservice into dir, once per run.
func buildService(ctx context.Context, dir string) (string, error) {
	bin := filepath.Join(dir, "orderservice")
	out, err := exec.CommandContext(ctx, "go", "build", "-o", bin, "github.com/orderservice/orderservice/cmd/orderservice").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("go build cmd/orderservice: %v\n%s", err, out)
	}
	return bin, nil
}

// startProcess runs bin with exactly env (HTTP_ADDR set to a free port)
// and returns once it is ready to serve.
func startProcess(ctx context.Context, bin string, env map[string]string) (*serviceProcess, error) {
	addr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	env["HTTP_ADDR"] = addr
	cfg, err := app.LoadConfig(env)
	if err != nil {
		return nil, err
	}
	p := &serviceProcess{url: "http://" + addr, config: cfg, cmd: exec.Command(bin), done: make(chan struct{})}
	for k, v := range env {
		p.cmd.Env = append(p.cmd.Env, k+"="+v)
	}
	p.cmd.Stdout, p.cmd.Stderr = &p.output, &p.output
	// A bench killed outright takes its service with it, not left serving
	// on the benchmark's database.
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := p.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start the service: %w", err)
	}
	go func() { _ = p.cmd.Wait(); close(p.done) }()
	if err := p.ready(ctx); err != nil {
		p.cmd.Process.Kill()
		<-p.done
		return nil, fmt.Errorf("%w; it printed:\n%s", err, p.output.Bytes())
	}
	return p, nil
}

// ready waits for /readyz to answer 200.
func (p *serviceProcess) ready(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, p.url+"/readyz", nil)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-p.done:
			return errors.New("the service exited before it was ready")
		case <-ctx.Done():
			return fmt.Errorf("the service was not ready: %w", ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Close stops the service as an operator would (SIGTERM) and waits for it.
func (p *serviceProcess) Close() error {
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return err
	}
	select {
	case <-p.done:
	case <-time.After(p.config.ShutdownTimeout + 5*time.Second):
		p.cmd.Process.Kill()
		<-p.done
		return fmt.Errorf("the service did not stop within %s of SIGTERM", p.config.ShutdownTimeout+5*time.Second)
	}
	if s := p.cmd.ProcessState; !s.Success() {
		return fmt.Errorf("the service stopped with %s; it printed:\n%s", s, p.output.Bytes())
	}
	return nil
}

func freeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}
