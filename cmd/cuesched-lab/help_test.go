package main

import (
	"testing"

	"github.com/cuesched/cuesched/shared/testkit/clitest"
)

func TestCLIConvention(t *testing.T) {
	t.Parallel()
	clitest.CheckAll(t, clitest.Binary{Program: program(), MinEnvCommands: 1, ConnectArgs: func(path string) []string {
		if path == "fake-rqd" {
			// Only --complete connects; a free port for its RQD server.
			return []string{"--complete", "--listen", "127.0.0.1:0"}
		}
		return nil
	}})
}
