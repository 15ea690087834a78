package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"time"

	"github.com/orderservice/orderservice/internal/app"
	"github.com/orderservice/orderservice/tests/testproc"
)

// serviceProcess is the service's own binary running beside the bench: the
// overload's service, so that the load generator's goroutines and garbage
// collector do not share the service's scheduler, as they do in this
// process. An open loop at three times capacity starts thousands of
// requests a second; in one process, each answer would wait behind them.
type serviceProcess struct {
	url    string
	config app.Config
	proc   *testproc.Process
	output bytes.Buffer // what it printed, for an error
	// cores, when split, are the CPUs it and its backends run on.
	cores cores
}

const servicePackage = "github.com/orderservice/orderservice/cmd/orderservice"

// serviceBinary compiles cmd/orderservice once per run, into a directory
// that close removes; the overload and the tracing scenarios share it.
func (b *bench) serviceBinary() (string, error) {
	if b.bin != "" {
		return b.bin, nil
	}
	dir, err := os.MkdirTemp("", "orderservice-bench-")
	if err != nil {
		return "", err
	}
	bins, err := testproc.Build(dir, servicePackage)
	if err != nil {
		_ = os.RemoveAll(dir)
		return "", err
	}
	b.bin, b.binDir = bins[servicePackage], dir
	return b.bin, nil
}

// startProcess runs bin with exactly env (HTTP_ADDR set to a free port)
// and returns once it is ready to serve.
func startProcess(bin string, env map[string]string) (*serviceProcess, error) {
	addr, err := testproc.Addr()
	if err != nil {
		return nil, err
	}
	env["HTTP_ADDR"] = addr
	cfg, err := app.LoadConfig(env)
	if err != nil {
		return nil, err
	}
	p := &serviceProcess{url: "http://" + addr, config: cfg}
	cmd := exec.Command(bin)
	cmd.Env, cmd.Stdout, cmd.Stderr = testproc.Env(env), &p.output, &p.output
	// A bench killed outright takes its service with it, not left serving
	// on the benchmark's database.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if p.proc, err = testproc.Launch("the service", cmd); err != nil {
		return nil, err
	}
	if err := p.proc.WaitOK(p.url+"/readyz", time.Minute); err != nil {
		p.kill()
		return nil, fmt.Errorf("%w; it printed:\n%s", err, p.output.Bytes())
	}
	return p, nil
}

// Close stops the service as an operator would (SIGTERM) and waits for it
// to exit with status 0.
func (p *serviceProcess) Close() error {
	if err := p.proc.Stop(p.config.ShutdownTimeout + 5*time.Second); err != nil {
		p.kill()
		return fmt.Errorf("%w; it printed:\n%s", err, p.output.Bytes())
	}
	return nil
}

func (p *serviceProcess) pid() int { return p.proc.Cmd.Process.Pid }

// kill ends the process at once and waits until it has.
func (p *serviceProcess) kill() {
	_ = p.proc.Cmd.Process.Kill()
	<-p.proc.Done
}
