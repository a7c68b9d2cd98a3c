package zone

import (
	"context"
	"testing"
)

func TestReportProgress(t *testing.T) {
	ReportProgress(context.Background(), "nobody listens") // no reporter: a no-op
	var got []string
	ctx := WithProgress(context.Background(), func(s string) { got = append(got, s) })
	ctx, cancel := context.WithCancel(ctx) // survives derived contexts
	defer cancel()
	ReportProgress(ctx, "waiting for tcp [fd00::5]:32345: connection refused")
	if len(got) != 1 || got[0] != "waiting for tcp [fd00::5]:32345: connection refused" {
		t.Fatalf("reports = %q", got)
	}
}
