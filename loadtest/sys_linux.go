package loadtest

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// clockTicks is USER_HZ, the unit of utime and stime in /proc/PID/stat;
// 100 on every Linux architecture Go supports.
const clockTicks = 100

// procCPU returns the user+system CPU time pid has used (/proc/PID/stat
// utime + stime).
func procCPU(pid int) (time.Duration, error) {
	_, cpu, err := procStat(pid)
	return cpu, err
}

// procStat reads the parent pid and the CPU time (utime + stime) of pid.
func procStat(pid int) (ppid int, cpu time.Duration, err error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0, err
	}
	// The command name (field 2) may contain spaces and parentheses: the
	// fields after it start behind the last ')'.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0, 0, fmt.Errorf("/proc/%d/stat: malformed", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	// f[0] is field 3 (state): ppid is field 4, utime 14, stime 15.
	if len(f) < 13 {
		return 0, 0, fmt.Errorf("/proc/%d/stat: malformed", pid)
	}
	ppid, _ = strconv.Atoi(f[1])
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, 0, fmt.Errorf("/proc/%d/stat: malformed", pid)
	}
	return ppid, time.Duration(ut+st) * time.Second / clockTicks, nil
}

// treeCPU returns the CPU time of pid and every live descendant (e.g. a
// PostgreSQL postmaster and its backends) keyed by pid, so two samples
// can be compared process by process.
func treeCPU(pid int) (map[int]time.Duration, error) {
	if _, err := os.Stat("/proc/" + strconv.Itoa(pid)); err != nil {
		return nil, err
	}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	parent := map[int]int{}
	cpu := map[int]time.Duration{}
	for _, e := range ents {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		pp, c, err := procStat(p)
		if err != nil {
			continue // exited meanwhile
		}
		parent[p], cpu[p] = pp, c
	}
	out := map[int]time.Duration{}
	for p := range cpu {
		for q, hops := p, 0; q > 0 && hops < 64; q, hops = parent[q], hops+1 {
			if q == pid {
				out[p] = cpu[p]
				break
			}
		}
	}
	return out, nil
}

// selfCPU is the CPU time this process has used.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// openFileLimit raises the soft RLIMIT_NOFILE to the hard limit if that
// gives more room, and returns the resulting soft limit.
func openFileLimit() (int64, error) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return 0, err
	}
	if lim.Cur < lim.Max {
		raised := lim
		raised.Cur = lim.Max
		if syscall.Setrlimit(syscall.RLIMIT_NOFILE, &raised) == nil {
			lim = raised
		}
	}
	return int64(lim.Cur), nil
}

// ephemeralPorts is how many local ports one source address can use for
// outgoing connections (net.ipv4.ip_local_port_range).
func ephemeralPorts() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 28000
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return 28000
	}
	lo, err1 := strconv.Atoi(f[0])
	hi, err2 := strconv.Atoi(f[1])
	if err1 != nil || err2 != nil || hi < lo {
		return 28000
	}
	return hi - lo + 1
}

// machineCPU is the busy CPU time of the whole machine (every process and
// the kernel; /proc/stat: all but idle and iowait).
func machineCPU() (time.Duration, error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, err
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 5 || f[0] != "cpu" {
		return 0, fmt.Errorf("/proc/stat: malformed")
	}
	var busy int64
	for i, s := range f[1:] {
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc/stat: malformed")
		}
		// user nice system idle iowait irq softirq steal guest guest_nice:
		// guest time is already counted in user.
		if i == 3 || i == 4 || i >= 8 {
			continue
		}
		busy += v
	}
	return time.Duration(busy) * time.Second / clockTicks, nil
}

// procRSS is the resident set size of pid in bytes (/proc/PID/status
// VmRSS); pid 0 means this process.
func procRSS(pid int) (int64, error) {
	name := "/proc/self/status"
	if pid > 0 {
		name = "/proc/" + strconv.Itoa(pid) + "/status"
	}
	b, err := os.ReadFile(name)
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			f := strings.Fields(v)
			if len(f) != 2 || f[1] != "kB" {
				break
			}
			kb, err := strconv.ParseInt(f[0], 10, 64)
			if err != nil {
				break
			}
			return kb << 10, nil
		}
	}
	return 0, fmt.Errorf("%s: no VmRSS", name)
}

// ipBindAddressNoPort is IP_BIND_ADDRESS_NO_PORT (Linux 4.2+).
const ipBindAddressNoPort = 24

// bindNoPort makes a dialer that binds a source address leave the choice
// of the port to connect(), which picks it by the whole 4-tuple (and may
// reuse a loopback TIME_WAIT port). Without it, bind() must find a port
// free for every destination, and with many thousands in use or in
// TIME_WAIT (a storm's reconnects) each bind scans for seconds.
func bindNoPort(_, _ string, c syscall.RawConn) error {
	var serr error
	if err := c.Control(func(fd uintptr) {
		serr = syscall.SetsockoptInt(int(fd), syscall.IPPROTO_IP, ipBindAddressNoPort, 1)
	}); err != nil {
		return err
	}
	return serr
}
