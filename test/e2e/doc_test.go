// Package e2e_test holds the end-to-end tests: whole parleyd processes
// (test/parleytest) on a real PostgreSQL and Redis, driven through the
// wire protocol (package client) and the admin API, as client teams and
// operators use them. Lower layers are tested in their own packages.
package e2e_test
