package shardadam

// #include <shardadam/shardadam.h>
import "C"

import "fmt"

// Status is the outcome of a call: one of the sa_status codes of shardadam.h.
type Status int

// The sa_status codes. A test checks each against the library's own names.
const (
	StatusOK              Status = 0  // SA_OK
	StatusInvalidArgument Status = 1  // a nil, out-of-range or inconsistent argument
	StatusUnsupported     Status = 2  // a valid request this build or backend cannot serve
	StatusOutOfMemory     Status = 3  // an allocation failed; nothing was changed
	StatusDevice          Status = 4  // the device backend reported an error
	StatusComm            Status = 5  // a communicator operation failed
	StatusIO              Status = 6  // reading or writing a blob failed
	StatusFormat          Status = 7  // a blob is not a valid shard file
	StatusMismatch        Status = 8  // data disagrees with what is registered (dtype, shape)
	StatusState           Status = 9  // the call is not allowed in the optimizer's current state
	StatusInternal        Status = 10 // a bug in shardadam; please report the message
)

// String returns the library's name for the status, e.g. "SA_ERR_MISMATCH".
func (s Status) String() string {
	return C.GoString(C.sa_status_string(C.sa_status(s)))
}

// Error is a failed call: its status and the library's message, which names the function,
// the param, what was expected and what arrived. The message is read before any other call
// can replace it (the optimizer's lock; the OS thread of a handle-less call), so it belongs
// to the call that failed even when goroutines fail concurrently. Match it with errors.As:
//
//	var e *shardadam.Error
//	if errors.As(err, &e) && e.Status == shardadam.StatusMismatch { ... }
type Error struct {
	Status  Status // the sa_status of the call
	Message string // the library's message (or the binding's, for checks made in Go)
}

// Error formats the status and the message.
func (e *Error) Error() string {
	return fmt.Sprintf("shardadam: %s: %s", e.Status, e.Message)
}

// bindingError is an error found by the Go binding before any native call.
func bindingError(status Status, format string, args ...interface{}) error {
	return &Error{Status: status, Message: fmt.Sprintf(format, args...)}
}
