package main

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// cores splits the machine for scenario 8, as two machines would be: the
// load generator (this process) on one CPU, the service's process and its
// PostgreSQL backends on the others. On two shared cores, answering the
// excess of an overload costs the generator as much CPU as the service
// (sending, reading and tallying each answer), and that CPU would come out
// of the service's capacity: the goodput would measure the generator.
type cores struct {
	all, generator, service unix.CPUSet
	// Split is false on a machine with one CPU, without affinity, or
	// when the bench is not root (PostgreSQL's backends belong to another
	// user): then everything shares the CPUs, and the report says why.
	Split bool
	Why   string
	// Generator and Service name the CPUs, for the report.
	Generator, Service string
}

// splitCores gives the last CPU this process may run on to the generator
// and the rest to the service.
func splitCores() cores {
	var c cores
	switch err := unix.SchedGetaffinity(0, &c.all); {
	case err != nil:
		c.Why = "the CPU affinity could not be read: " + err.Error()
		return c
	case c.all.Count() < 2:
		c.Why = "there is one CPU"
		return c
	case os.Geteuid() != 0:
		c.Why = "the bench is not root, and PostgreSQL's backends belong to another user"
		return c
	}
	c.service = c.all
	for cpu := len(c.all)*64 - 1; cpu >= 0; cpu-- {
		if c.all.IsSet(cpu) {
			c.service.Clear(cpu)
			c.generator.Set(cpu)
			c.Generator = strconv.Itoa(cpu)
			break
		}
	}
	c.Split = true
	c.Service = cpuList(c.service)
	return c
}

// toGenerator moves this process to the generator's CPU.
func (c cores) toGenerator() error { return c.move(c.generator, "self") }

// toService moves the processes of pids (the service's, its backends) to
// the service's CPUs.
func (c cores) toService(pids ...int) error { return c.move(c.service, procs(pids)...) }

// restore gives this process, and the processes of pids (backends moved to
// the service's CPUs that outlive the scenario: the bench's own), every CPU
// again.
func (c cores) restore(pids ...int) error { return c.move(c.all, append(procs(pids), "self")...) }

// move pins each process of names ("self" or a pid) to set, when the
// machine is split.
func (c cores) move(set unix.CPUSet, names ...string) error {
	if !c.Split {
		return nil
	}
	var errs []error
	for _, name := range names {
		errs = append(errs, pin(name, set))
	}
	return errors.Join(errs...)
}

// keepOnService moves, every interval until stop, each process of list()
// that is not on the service's CPUs there. A PostgreSQL backend started
// after the others were moved starts on the postmaster's CPUs, all of
// them: the service's pool replaces each connection after
// DB_CONN_MAX_LIFETIME (2 min), and a replaced backend left there would
// give the service the generator's CPU too. stop ends the watch and says
// how many processes it moved.
func (c cores) keepOnService(list func() []int, interval time.Duration) (stop func() (moved int, err error)) {
	if !c.Split {
		return func() (int, error) { return 0, nil }
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	var moved int
	var errs []error
	wg.Go(func() {
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
			}
			for _, pid := range list() {
				var set unix.CPUSet
				if err := unix.SchedGetaffinity(pid, &set); err != nil || set == c.service {
					continue // gone, or already there
				}
				if err := pin(strconv.Itoa(pid), c.service); err != nil {
					errs = append(errs, err)
					continue
				}
				moved++
			}
		}
	})
	return func() (int, error) {
		close(done)
		wg.Wait()
		return moved, errors.Join(errs...)
	}
}

// procs names pids as /proc does.
func procs(pids []int) []string {
	names := make([]string, len(pids))
	for i, pid := range pids {
		names[i] = strconv.Itoa(pid)
	}
	return names
}

// pin sets the CPUs of every thread of a process ("self" or a pid). A
// thread started meanwhile takes its starter's CPUs, so a second pass
// catches one started by a thread not yet moved.
func pin(pid string, set unix.CPUSet) error {
	for range 2 {
		tasks, err := os.ReadDir("/proc/" + pid + "/task")
		if errors.Is(err, fs.ErrNotExist) {
			return nil // it exited: nothing left to move
		}
		if err != nil {
			return fmt.Errorf("CPU affinity of %s: %w", pid, err)
		}
		for _, t := range tasks {
			tid, _ := strconv.Atoi(t.Name())
			if err := unix.SchedSetaffinity(tid, &set); err != nil && !errors.Is(err, unix.ESRCH) {
				return fmt.Errorf("CPU affinity of %s's thread %d: %w", pid, tid, err)
			}
		}
	}
	return nil
}

// cpuList names the CPUs of set: "0", "0,1,2".
func cpuList(set unix.CPUSet) string {
	s := ""
	for cpu := range len(set) * 64 {
		if set.IsSet(cpu) {
			if s != "" {
				s += ","
			}
			s += strconv.Itoa(cpu)
		}
	}
	return s
}
