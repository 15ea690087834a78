package main

import (
	"os/exec"
	"runtime"
	"strconv"
	"testing"

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
