//go:build !race

package parleytest

// raceBuild: see race.go.
const raceBuild = false
