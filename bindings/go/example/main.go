// Command example fits a [6, 4] weight to a target with AdamW, the weight sharded by rows
// over a mesh of 2 simulated ranks (one Optimizer per rank, as each rank of a real job
// would have), and prints the loss as it falls. Then it shows what a failed call returns.
//
// Run it from bindings/go, with the library found by pkg-config (see the package doc):
//
//	PKG_CONFIG_PATH=<prefix>/lib/pkgconfig LD_LIBRARY_PATH=<prefix>/lib go run ./example
package main

import (
	"errors"
	"fmt"
	"log"
	"math/rand"

	shardadam "github.com/shardadam/shardadam/bindings/go"
)

// rank is one simulated rank: its optimizer, its shard of the weight and of the target.
type rank struct {
	opt    *shardadam.Optimizer
	w      *shardadam.Param
	target []float32
}

func main() {
	fmt.Println(shardadam.BuildInfo())
	global := []int64{6, 4}
	rng := rand.New(rand.NewSource(1))
	target := make([]float32, global[0]*global[1])
	for i := range target {
		target[i] = float32(rng.NormFloat64())
	}

	// The fields it does not name keep the library's defaults (torch.optim.AdamW's).
	hp := shardadam.GroupConfig{"lr": 0.1, "weight_decay": 0}
	ranks := make([]rank, 2)
	for r := range ranks {
		layout := shardadam.Layout{GlobalShape: global, MeshShape: []int64{2},
			MeshCoord: []int64{int64(r)}, Placements: []shardadam.Placement{shardadam.Shard(0)}}
		local, offset, err := shardadam.LocalBox(layout)
		if err != nil {
			log.Fatal(err)
		}
		opt, err := shardadam.NewOptimizer(&shardadam.Config{NumThreads: 1})
		if err != nil {
			log.Fatal(err)
		}
		defer opt.Close()
		if _, err := opt.AddGroup(hp); err != nil {
			log.Fatal(err)
		}
		numel := local[0] * local[1]
		w, err := opt.AddParam("fit.w", 0, local, make([]float32, numel), &shardadam.ParamOptions{Layout: &layout})
		if err != nil {
			log.Fatal(err)
		}
		start := offset[0] * global[1] // row-major: this shard is rows [offset, offset + local)
		ranks[r] = rank{opt: opt, w: w, target: target[start : start+numel]}
		fmt.Printf("rank %d holds rows [%d, %d)\n", r, offset[0], offset[0]+local[0])
	}

	firstLoss, loss := 0.0, 0.0
	for step := 1; step <= 60; step++ {
		loss = 0.0
		for _, rk := range ranks {
			// loss = 1/2 |w - target|^2, so grad = w - target.
			w := rk.w.Float32()
			grad := make([]float32, len(w))
			for i := range w {
				grad[i] = w[i] - rk.target[i]
				loss += 0.5 * float64(grad[i]*grad[i])
			}
			if err := rk.opt.SetGrad(rk.w, grad); err != nil {
				log.Fatal(err)
			}
			if err := rk.opt.Step(); err != nil {
				log.Fatal(err)
			}
		}
		if step == 1 {
			firstLoss = loss
		}
		if step == 1 || step%20 == 0 {
			fmt.Printf("step %2d  loss %.5f\n", step, loss)
		}
	}
	if loss > 0.01*firstLoss {
		log.Fatalf("the loss fell only from %.5f to %.5f", firstLoss, loss)
	}

	// A failed call: the status and the library's message, which names the param.
	err := ranks[0].opt.SetGrad16(ranks[0].w, shardadam.BFloat16, make([]uint16, ranks[0].w.Numel()))
	var e *shardadam.Error
	if errors.As(err, &e) {
		fmt.Printf("status %s: %s\n", e.Status, e.Message)
	}
}
