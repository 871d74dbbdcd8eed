//go:build race

package parleytest

// raceBuild: this test binary was built with -race, and so is the parleyd
// that Binary builds: it then links against the race-instrumented
// packages the tests already compiled instead of compiling every
// dependency a second time, and a data race in the process fails the
// test that started it as one in the test binary would.
const raceBuild = true
