//go:build !linux

package loadtest

import (
	"errors"
	"syscall"
	"time"
)

var errNoProc = errors.New("process CPU accounting needs Linux /proc")

func procCPU(pid int) (time.Duration, error)         { return 0, errNoProc }
func treeCPU(pid int) (map[int]time.Duration, error) { return nil, errNoProc }
func procStat(pid int) (int, time.Duration, error)   { return 0, 0, errNoProc }
func selfCPU() time.Duration                         { return 0 }
func openFileLimit() (int64, error)                  { return 1 << 20, nil }
func ephemeralPorts() int                            { return 28000 }
func machineCPU() (time.Duration, error)             { return 0, errNoProc }
func procRSS(pid int) (int64, error)                 { return 0, errNoProc }

var bindNoPort func(network, address string, c syscall.RawConn) error
