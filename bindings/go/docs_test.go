package shardadam

import (
	"os"
	"strings"
	"testing"
)

// docs/go.md quotes example/gpu/main.go, which CI builds and runs, and the examples of
// docs_example_test.go, which `go test` runs against their // Output: comments; the quotes
// must not drift from them: every line of the page's Go blocks is a line of one of them.
func TestTheGoPageQuotesTheProgramsThatCIRuns(t *testing.T) {
	page, err := os.ReadFile("../../docs/go.md")
	if err != nil {
		t.Fatal(err)
	}
	var example []byte
	for _, file := range []string{"example/gpu/main.go", "docs_example_test.go"} {
		text, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		example = append(append(example, text...), '\n')
	}
	lines := map[string]bool{}
	for _, line := range strings.Split(string(example), "\n") {
		lines[line] = true
	}
	quoted, inGo := 0, false
	for n, line := range strings.Split(string(page), "\n") {
		switch {
		case strings.HasPrefix(line, "```go"):
			inGo = true
		case strings.HasPrefix(line, "```"):
			inGo = false
		case inGo && strings.TrimSpace(line) != "":
			quoted++
			if !lines[line] {
				t.Errorf("docs/go.md:%d quotes a line that neither example/gpu/main.go nor docs_example_test.go has: %q", n+1, line)
			}
		}
	}
	if quoted == 0 {
		t.Errorf("docs/go.md quotes no Go line")
	}
}
