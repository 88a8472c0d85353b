package main

import (
	"testing"

	"github.com/cuesched/cuesched/shared/testkit/clitest"
)

func TestCLIConvention(t *testing.T) {
	t.Parallel()
	clitest.CheckAll(t, clitest.Binary{Program: program(), MinEnvCommands: 1})
}
