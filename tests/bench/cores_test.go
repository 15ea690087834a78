package main

import (
	"os/exec"
	"runtime"
	"strconv"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// On this machine (two CPUs or more, as root, as CI runs it) §8 moves the
// bench to the last CPU and another process to the rest, and gives the
// bench every CPU back; each move is read back from the kernel.
func TestTheOverloadSplitsTheCPUs(t *testing.T) {
	c := splitCores()
	if !c.Split {
		t.Fatalf("the CPUs were not split: %s (the benchmark's machine has two CPUs and runs as root)", c.Why)
	}
	runtime.LockOSThread() // SchedGetaffinity(0) reads the calling thread
	defer runtime.UnlockOSThread()
	affinity := func(pid int) unix.CPUSet {
		var set unix.CPUSet
		if err := unix.SchedGetaffinity(pid, &set); err != nil {
			t.Fatal(err)
		}
		return set
	}
	if err := c.toGenerator(); err != nil {
		t.Fatal(err)
	}
	if got := cpuList(affinity(0)); got != c.Generator {
		t.Errorf("the bench runs on CPUs %s, want the generator's, %s", got, c.Generator)
	}
	other := exec.Command("sleep", "30")
	if err := other.Start(); err != nil {
		t.Fatal(err)
	}
	defer other.Process.Kill()
	if err := c.toService(other.Process.Pid); err != nil {
		t.Fatal(err)
	}
	if got := cpuList(affinity(other.Process.Pid)); got != c.Service {
		t.Errorf("process %s runs on CPUs %s, want the service's, %s", strconv.Itoa(other.Process.Pid), got, c.Service)
	}
	if err := c.restore(other.Process.Pid); err != nil {
		t.Fatal(err)
	}
	for _, pid := range []int{0, other.Process.Pid} {
		if got, want := cpuList(affinity(pid)), cpuList(c.all); got != want {
			t.Errorf("after restore, process %d runs on CPUs %s, want all, %s", pid, got, want)
		}
	}
}

// A process started after the others were moved (a backend the service's
// pool opened in place of an old one) is moved to the service's CPUs by the
// watch, once.
func TestTheWatchMovesAProcessStartedLater(t *testing.T) {
	c := splitCores()
	if !c.Split {
		t.Fatalf("the CPUs were not split: %s (the benchmark's machine has two CPUs and runs as root)", c.Why)
	}
	later := exec.Command("sleep", "30")
	if err := later.Start(); err != nil {
		t.Fatal(err)
	}
	defer later.Process.Kill()
	pid := later.Process.Pid
	stop := c.keepOnService(func() []int { return []int{pid} }, 10*time.Millisecond)
	var set unix.CPUSet
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if err := unix.SchedGetaffinity(pid, &set); err != nil {
			t.Fatal(err)
		}
		if cpuList(set) == c.Service || time.Now().After(deadline) {
			break
		}
	}
	time.Sleep(50 * time.Millisecond) // more rounds of the watch: it must not count it again
	moved, err := stop()
	if err != nil {
		t.Fatal(err)
	}
	if got := cpuList(set); got != c.Service || moved != 1 {
		t.Errorf("the process started later runs on CPUs %s after the watch moved %d processes; want the service's, %s, and 1", got, moved, c.Service)
	}
}
