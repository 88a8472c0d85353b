package main

import (
	"github.com/cuesched/cuesched/shared/config"
)

func exampleConfig() string { return config.Example() }
