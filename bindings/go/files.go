package shardadam

// #include <shardadam/shardadam.h>
import "C"

import (
	"sync"
	"unsafe"
)

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

// SaveAsync starts writing this rank's state as one shard file at path and returns
// without waiting for the write (sa_optimizer_export_async). It copies the state into a
// snapshot the optimizer keeps, so Step, Load and hyperparameter changes may run right
// after it returns: they change the state, not the snapshot, and the file is byte for
// byte what Save would have written at the moment of the call. A thread of the library's
// then writes the snapshot to a temporary name beside path, syncs it and renames it into
// place: the file at path appears (or an existing one is replaced, whole) only when the
// job ends, and only if it succeeded.
//
// One export writes at a time per optimizer: a Save or SaveAsync called while a job is
// still writing waits for it to end first (holding the optimizer meanwhile, as every
// method does). The optimizer's Close waits for it too; the job stays usable after that.
//
// Errors found before the write starts (a path whose directory does not exist, a closed
// or unusable optimizer) are returned here, with a nil job. Others (a full disk, a failed
// write) come from the job's Wait or Done, and nothing is renamed into place. The job
// must be released with Close (which waits for it), whatever its outcome.
func (o *Optimizer) SaveAsync(path string) (*ExportJob, error) {
	const op = "shardadam.SaveAsync"
	if err := checkNoNUL(op, "path", path); err != nil {
		return nil, err
	}
	// The writer in C memory that lives until the job is closed: the library's thread
	// writes through its ctx until the job has ended.
	job := &ExportJob{}
	writer := (*C.sa_writer)(job.mem.alloc(C.sizeof_sa_writer))
	writer.struct_size = C.sizeof_sa_writer
	if err := handleless(func() C.sa_status { return C.sa_file_writer(job.mem.str(path), writer) }); err != nil {
		job.mem.free()
		return nil, err
	}
	if err := o.lock(op); err != nil {
		C.sa_writer_release(writer) // removes the temporary file
		job.mem.free()
		return nil, err
	}
	var handle *C.sa_export_job
	err := o.check(C.sa_optimizer_export_async(o.handle, writer, &handle))
	o.mu.Unlock()
	if err != nil { // nothing started; the message was read under the lock
		C.sa_writer_release(writer)
		job.mem.free()
		return nil, err
	}
	job.handle, job.writer = handle, writer
	return job, nil
}

// ExportJob is a SaveAsync in flight (sa_export_job). Wait blocks until it has ended; Done
// asks without blocking. Neither holds the optimizer: its methods run while the job
// writes. Its methods may be called from several goroutines. Release it with Close.
type ExportJob struct {
	// Held shared by the calls on the handle (Wait may block holding it), exclusively by
	// Close, which frees the handle.
	mu     sync.RWMutex
	handle *C.sa_export_job // nil once closed
	mem    cArena           // the writer and its path, freed by Close

	// The outcome, kept the first time a call sees the job ended; the writer is released
	// then (a failed file writer removes its temporary file).
	endMu  sync.Mutex
	ended  bool
	err    error
	writer *C.sa_writer // nil once released
}

// Wait blocks until the job has ended and returns its outcome: nil once the file is
// committed at its path, else an *Error with the status and the job's message (the
// file at path is then untouched). Calling it again, or after Close, returns the same.
func (j *ExportJob) Wait() error {
	j.mu.RLock()
	defer j.mu.RUnlock()
	if j.handle == nil {
		return j.outcome()
	}
	return j.end(C.sa_export_job_wait(j.handle))
}

// Done reports whether the job has ended, without waiting for the write
// (sa_export_job_poll; only a Close under way, which waits for it, holds Done up); once
// it has, err is what Wait returns. While it runs: false, nil.
func (j *ExportJob) Done() (bool, error) {
	j.mu.RLock()
	defer j.mu.RUnlock()
	if j.handle == nil {
		return true, j.outcome()
	}
	var done C.int32_t
	status := C.sa_export_job_poll(j.handle, &done)
	if done == 0 {
		return false, nil
	}
	return true, j.end(status)
}

// Close waits for the job to end, releases its writer and the handle
// (sa_export_job_release), and returns the job's outcome, as Wait does. Closing twice
// returns the same again.
func (j *ExportJob) Close() error {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.handle == nil {
		return j.outcome()
	}
	err := j.end(C.sa_export_job_wait(j.handle)) // releases the writer
	C.sa_export_job_release(j.handle)
	j.handle = nil
	j.mem.free()
	return err
}

// end records the outcome of the ended job, its status as wait or poll returned it,
// the first time, and releases the writer; it returns the outcome. The caller holds mu
// (so the handle is valid to read the message from).
func (j *ExportJob) end(status C.sa_status) error {
	j.endMu.Lock()
	defer j.endMu.Unlock()
	if !j.ended {
		if status != C.SA_OK {
			j.err = &Error{Status: Status(status), Message: C.GoString(C.sa_export_job_last_error(j.handle))}
		}
		j.ended = true
		C.sa_writer_release(j.writer)
		j.writer = nil
	}
	return j.err
}

// outcome is the recorded outcome of a job that has ended.
func (j *ExportJob) outcome() error {
	j.endMu.Lock()
	defer j.endMu.Unlock()
	return j.err
}

// LoadOptions holds the options of Load (sa_import_options). The zero value gives the
// library's defaults.
type LoadOptions struct {
	AllowMissing    bool  // params absent from the files keep their state (else an error)
	AllowUnexpected bool  // params in the files that this optimizer lacks are ignored
	KeepGroups      bool  // keep the groups' hyperparameters and step counts (else restored)
	StagingBytes    int64 // bytes of the staging buffer; 0: the library's default (64 MiB)
	// ReadOnce reads each byte once even when the data exceed the staging buffer: each
	// block is checked as it is read, before it is copied, so a damaged block found after
	// copying began leaves the optimizer unusable (until a Load succeeds) instead of
	// unchanged. For a resume into a fresh optimizer.
	ReadOnce bool
	// Fields sets more number fields of sa_import_options by their C names (the library's
	// table: StructFields(StructImportOptions) lists them), so that an option of a newer
	// library needs no new member here. The library checks them as it checks the others; a
	// name it does not know, or a field that is not a number, is refused with
	// StatusInvalidArgument. A field set both ways takes the value here.
	Fields map[string]float64
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
		allow_unexpected: flag(opts.AllowUnexpected), restore_groups: flag(!opts.KeepGroups),
		read_once: flag(opts.ReadOnce)}
	if err := setFields(op, StructImportOptions, unsafe.Pointer(&options), C.sizeof_sa_import_options, opts.Fields); err != nil {
		return err
	}
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
