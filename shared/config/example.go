package config

import _ "embed"

//go:embed example.yaml
var exampleYAML string

// Example returns the annotated example configuration with every default. A
// test keeps it equal to Default.
func Example() string { return exampleYAML }
