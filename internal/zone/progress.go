package zone

import "context"

// A runtime call can say what it is doing while it waits ("waiting for tcp
// [fd00::5]:32345: connection refused"), so that status read while the call
// is in flight explains itself. The caller puts a reporter in the call's
// context; the runtime reports through ReportProgress, which does nothing
// when there is no reporter. A reporter must not block: it is called from the
// runtime's wait loops.

type progressKey struct{}

// WithProgress returns a context whose runtime calls report their progress
// to report.
func WithProgress(ctx context.Context, report func(string)) context.Context {
	return context.WithValue(ctx, progressKey{}, report)
}

// ReportProgress tells ctx's reporter, if any, what the call is doing now.
func ReportProgress(ctx context.Context, what string) {
	if report, ok := ctx.Value(progressKey{}).(func(string)); ok && report != nil {
		report(what)
	}
}
