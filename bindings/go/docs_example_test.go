package shardadam_test

// The CPU programs that docs/go.md quotes, run by `go test` as examples: their printed
// output must be the `// Output:` comment, and docs_test.go checks that every line the
// page quotes is a line of this file or of example/gpu/main.go.

import (
	"fmt"
	"log"
	"os"
	"path/filepath"

	shardadam "github.com/shardadam/shardadam/bindings/go"
)

func Example_shardedStep() {
	dir, err := os.MkdirTemp("", "shardadam-go-docs")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "rank1.safetensors")

	opt, err := shardadam.NewOptimizer(nil)
	if err != nil {
		log.Fatal(err)
	}
	defer opt.Close()
	// Hyperparameters by the library's names (shardadam.GroupFields lists them); the rest
	// keep the defaults, torch.optim.AdamW's.
	group, err := opt.AddGroup(shardadam.GroupConfig{"lr": 0.1})
	if err != nil {
		log.Fatal(err)
	}
	// Rank 1 of 2 holds rows [2, 4) of a [4, 3] weight.
	layout := shardadam.Layout{GlobalShape: []int64{4, 3}, MeshShape: []int64{2},
		MeshCoord: []int64{1}, Placements: []shardadam.Placement{shardadam.Shard(0)}}
	w, err := opt.AddParam("layers.0.w", group, []int64{2, 3}, make([]float32, 6),
		&shardadam.ParamOptions{Layout: &layout})
	if err != nil {
		log.Fatal(err)
	}
	grad, err := opt.HostGrad(w) // C memory the optimizer owns, bound once
	if err != nil {
		log.Fatal(err)
	}
	copy(grad.Float32(), []float32{1, 2, 3, 4, 5, 6}) // each step: write the grads, then Step
	if err := opt.Step(); err != nil {
		log.Fatal(err) // *shardadam.Error: status and message, e.g. which param lacks a grad
	}
	fmt.Printf("%.3f\n", w.Float32()) // updated in place: C memory the optimizer owns
	if err := opt.Save(path); err != nil {
		log.Fatal(err)
	}
	// Output:
	// [-0.100 -0.100 -0.100 -0.100 -0.100 -0.100]
}

func ExampleNewHostComm() {
	opt, err := shardadam.NewOptimizer(nil)
	if err != nil {
		log.Fatal(err)
	}
	defer opt.Close()
	if _, err := opt.AddGroup(shardadam.GroupConfig{}); err != nil {
		log.Fatal(err)
	}
	w, err := opt.AddParam("w", 0, []int64{2}, []float32{1, 2}, nil)
	if err != nil {
		log.Fatal(err)
	}
	if err := opt.SetGrad(w, []float32{3, 4}); err != nil {
		log.Fatal(err)
	}
	// A job of one rank: the reduction over all ranks leaves the values as they are.
	myAllReduce := func(values []float64, op shardadam.ReduceOp) error { return nil }

	comm, err := shardadam.NewHostComm(func(values []float64, op shardadam.ReduceOp) error {
		return myAllReduce(values, op) // in place, over all ranks: sum or max
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := opt.SetComm(comm); err != nil { // the optimizer keeps it alive
		log.Fatal(err)
	}
	comm.Close()
	report, err := opt.StepWith(shardadam.StepArgs{MaxGradNorm: 1.0}) // collective
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(report.GradNorm, report.Skipped)
	// Output:
	// 5 false
}
