package main

import (
	"context"
	"errors"
	"net/http"
	"time"
)

// apart is how a scenario runs its services apart from the load: each in
// a process of its own (the binary cmd/orderservice builds with the bench's
// configuration, see serviceProcess), on CPUs split from the load
// generator's, with the PostgreSQL backends moved to the service's; the
// in-process service is stopped meanwhile, so only they work on the
// database. The overload (§8) and the tenants' shares (§14) run so.
type apart struct {
	b      *bench
	bin    string
	cores  cores
	client *http.Client
	// closers undo what setApart did, last first.
	closers []func() error
	// repinned counts the backends the watch moved.
	repinned *int
}

// setApart stops the in-process service, splits the CPUs and starts the
// watch that keeps new backends on the service's; client is the load's
// HTTP client, its attempts bounded by timeout. close undoes it all.
func (b *bench) setApart(ctx context.Context, timeout time.Duration) (ap *apart, err error) {
	ap = &apart{b: b, repinned: new(int)}
	defer func() {
		if err != nil {
			err = errors.Join(err, ap.close(ctx))
		}
	}()
	if ap.bin, err = b.serviceBinary(); err != nil {
		return ap, err
	}
	if err := b.svc.Close(); err != nil {
		return ap, err
	}
	b.svc = nil
	ap.closers = append(ap.closers, func() error {
		var err error
		b.svc, err = b.startService(ctx, b.opts.Pool, nil)
		return err
	})
	ap.cores = splitCores()
	if err := ap.cores.toGenerator(); err != nil {
		return ap, err
	}
	ap.closers = append(ap.closers, func() error { return ap.cores.restore(b.backendPIDs()...) })
	// Backends started later (a connection the pool replaced) go to the
	// service's CPUs too; the watch has a connection of its own, as the
	// admin connection is for one goroutine.
	watch, err := b.connect(ctx)
	if err != nil {
		return ap, err
	}
	ap.closers = append(ap.closers, func() error { return watch.Close(context.Background()) })
	stopWatch := ap.cores.keepOnService(func() []int { return backendPIDs(watch) }, repinEvery)
	ap.closers = append(ap.closers, func() error {
		var err error
		*ap.repinned, err = stopWatch()
		b.progress("  %d backends started during the scenario were moved to the service's CPUs", *ap.repinned)
		return err
	})
	ap.client = &http.Client{Timeout: timeout, Transport: &http.Transport{MaxIdleConns: 0, MaxIdleConnsPerHost: 4096, IdleConnTimeout: time.Minute}}
	ap.closers = append(ap.closers, func() error { ap.client.CloseIdleConnections(); return nil })
	return ap, nil
}

// launch starts the service with extra, its process on the service's
// CPUs.
func (ap *apart) launch(extra map[string]string) (*serviceProcess, error) {
	ap.client.CloseIdleConnections()
	svc, err := startProcess(ap.bin, ap.b.serviceEnv(ap.b.opts.Pool, extra))
	if err != nil {
		return nil, err
	}
	svc.cores = ap.cores
	if err := svc.cores.toService(svc.pid()); err != nil {
		return nil, errors.Join(err, svc.Close())
	}
	return svc, nil
}

// close undoes setApart, last step first: the in-process service is back.
func (ap *apart) close(context.Context) error {
	var errs []error
	for i := len(ap.closers) - 1; i >= 0; i-- {
		errs = append(errs, ap.closers[i]())
	}
	ap.closers = nil
	return errors.Join(errs...)
}
