package shardadam

import (
	"os"
	"strings"
	"testing"
)

// docs/go.md quotes example/gpu/main.go, which CI builds and runs; the quotes must not
// drift from it: every line of the page's Go blocks is a line of the example.
func TestTheGPUPageQuotesTheExampleThatCIRuns(t *testing.T) {
	page, err := os.ReadFile("../../docs/go.md")
	if err != nil {
		t.Fatal(err)
	}
	example, err := os.ReadFile("example/gpu/main.go")
	if err != nil {
		t.Fatal(err)
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
				t.Errorf("docs/go.md:%d quotes a line that example/gpu/main.go lacks: %q", n+1, line)
			}
		}
	}
	if quoted == 0 {
		t.Errorf("docs/go.md quotes no Go line")
	}
}
