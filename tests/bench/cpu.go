package main

import (
	"os"
	"strconv"
	"strings"
	"time"
)

// clockTick is Linux's USER_HZ, the unit of the CPU times in /proc.
const clockTick = 10 * time.Millisecond

// cpuSample is the CPU time used so far by this process (service, load
// generator and direct client alike) with the service's own process where
// it runs in one (scenario 8), by the PostgreSQL backends serving the
// benchmark's database, and by the whole machine.
type cpuSample struct {
	at       time.Time
	process  time.Duration
	backends map[int]time.Duration // by PostgreSQL backend pid
	machine  time.Duration
	ok       bool
}

// cpuUse is the CPU time spent over one measurement. Other is the
// machine's busy time outside this process and those backends: whatever
// else ran (PostgreSQL's own background processes, other programs). When
// it is large, the machine was not quiet and the figures are pessimistic.
type cpuUse struct {
	Wall     time.Duration
	Process  time.Duration
	Postgres time.Duration
	Other    time.Duration
	OK       bool
}

// readCPU samples /proc for this process and the processes of also, the
// backends and the machine; on a system without /proc the sample is marked
// unusable and the report prints n/a.
func readCPU(backends, also []int) cpuSample {
	s := cpuSample{at: time.Now(), backends: map[int]time.Duration{}}
	self, ok := procCPU("self")
	all, err := os.ReadFile("/proc/stat")
	if !ok || err != nil {
		return s
	}
	s.process = self
	for _, pid := range also {
		t, ok := procCPU(strconv.Itoa(pid))
		if !ok {
			return s
		}
		s.process += t
	}
	for _, pid := range backends {
		if t, ok := procCPU(strconv.Itoa(pid)); ok {
			s.backends[pid] = t
		}
	}
	// "cpu  user nice system idle iowait irq softirq steal ...": busy is all
	// but idle and iowait.
	line, _, _ := strings.Cut(string(all), "\n")
	g := strings.Fields(line)
	if len(g) < 9 || g[0] != "cpu" {
		return s
	}
	for i, v := range g[1:9] {
		if i != 3 && i != 4 {
			s.machine += ticks(v)
		}
	}
	s.ok = true
	return s
}

// procCPU is the user+system time of /proc/<pid>.
func procCPU(pid string) (time.Duration, bool) {
	b, err := os.ReadFile("/proc/" + pid + "/stat")
	if err != nil {
		return 0, false
	}
	// Fields after the parenthesised command name: utime and stime are the
	// 12th and 13th of them.
	rest := string(b)
	if i := strings.LastIndexByte(rest, ')'); i >= 0 {
		rest = rest[i+1:]
	}
	f := strings.Fields(rest)
	if len(f) < 13 {
		return 0, false
	}
	return ticks(f[11]) + ticks(f[12]), true
}

func ticks(v string) time.Duration {
	n, _ := strconv.ParseInt(v, 10, 64)
	return time.Duration(n) * clockTick
}

// since is the CPU used between before and s. A backend that started in
// between counts from zero.
func (s cpuSample) since(before cpuSample) cpuUse {
	u := cpuUse{Wall: s.at.Sub(before.at), OK: s.ok && before.ok}
	if !u.OK {
		return u
	}
	u.Process = s.process - before.process
	for pid, t := range s.backends {
		u.Postgres += t - before.backends[pid]
	}
	u.Other = max(0, s.machine-before.machine-u.Process-u.Postgres)
	return u
}
