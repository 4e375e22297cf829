package shardadam

// #include <shardadam/shardadam.h>
import "C"

import "unsafe"

// Save writes this rank's state as one shard file at path (sa_optimizer_export): every
// param's states, the groups with their step counts, and where each shard sits in its
// global tensor. The file is a valid safetensors file. It is written to a temporary name,
// synced and renamed, so a crash never leaves a file that looks complete. A param
// replicated along a mesh dim is written only by the replica at coordinate 0.
func (o *Optimizer) Save(path string) error {
	const op = "shardadam.Save"
	if err := checkNoNUL(op, "path", path); err != nil {
		return err
	}
	var mem cArena
	defer mem.free()
	writer := (*C.sa_writer)(mem.alloc(C.sizeof_sa_writer))
	writer.struct_size = C.sizeof_sa_writer
	if err := handleless(func() C.sa_status { return C.sa_file_writer(mem.str(path), writer) }); err != nil {
		return err
	}
	// Released after the message is read; removes the temporary file of a failed export.
	defer C.sa_writer_release(writer)
	if err := o.lock(op); err != nil {
		return err
	}
	defer o.mu.Unlock()
	return o.check(C.sa_optimizer_export(o.handle, writer))
}

// LoadOptions holds the options of Load (sa_import_options). The zero value gives the
// library's defaults.
type LoadOptions struct {
	AllowMissing    bool  // params absent from the files keep their state (else an error)
	AllowUnexpected bool  // params in the files that this optimizer lacks are ignored
	KeepGroups      bool  // keep the groups' hyperparameters and step counts (else restored)
	StagingBytes    int64 // bytes of the staging buffer; 0: the library's default (64 MiB)
}

// Load reads the state saved in the shard files at paths, written by any number of ranks
// with any layout, into this optimizer's state, resharding as needed
// (sa_optimizer_import). Everything is validated before anything changes: every saved box
// that meets a local one must cover it exactly once, shapes and dtypes must agree, and the
// checksums of every block read must match. Params themselves are not touched. opts may
// be nil.
func (o *Optimizer) Load(paths []string, opts *LoadOptions) error {
	const op = "shardadam.Load"
	if opts == nil {
		opts = &LoadOptions{}
	}
	var mem cArena
	defer mem.free()
	// The readers and the list of them in C memory: the list points to the readers.
	readers := unsafe.Slice((*C.sa_reader)(mem.alloc(uintptr(len(paths))*C.sizeof_sa_reader)), len(paths))
	list := unsafe.Slice((**C.sa_reader)(mem.alloc(uintptr(len(paths))*unsafe.Sizeof((*C.sa_reader)(nil)))), len(paths))
	for i, path := range paths {
		if err := checkNoNUL(op, "path", path); err != nil {
			return err
		}
		readers[i].struct_size = C.sizeof_sa_reader
		if err := handleless(func() C.sa_status { return C.sa_file_reader(mem.str(path), &readers[i]) }); err != nil {
			return err
		}
		defer C.sa_reader_release(&readers[i])
		list[i] = &readers[i]
	}
	options := C.sa_import_options{struct_size: C.sizeof_sa_import_options,
		staging_bytes: C.uint64_t(opts.StagingBytes), allow_missing: flag(opts.AllowMissing),
		allow_unexpected: flag(opts.AllowUnexpected), restore_groups: flag(!opts.KeepGroups)}
	if err := o.lock(op); err != nil {
		return err
	}
	defer o.mu.Unlock()
	var first **C.sa_reader
	if len(list) > 0 {
		first = &list[0]
	}
	return o.check(C.sa_optimizer_import(o.handle, C.int32_t(len(paths)), first, &options))
}

// flag is a bool as the C ABI takes it.
func flag(b bool) C.int32_t {
	if b {
		return 1
	}
	return 0
}
