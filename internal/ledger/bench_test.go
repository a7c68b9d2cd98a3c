package ledger

import (
	"bytes"
	"fmt"
	"path/filepath"
	"testing"
)

// BenchmarkCommit commits a document the size of a 1,000-crucible sled
// config with its storage (about 1.3 MB) to two copies, each written to a
// temp file, fsynced, renamed over the copy and its directory fsynced.
func BenchmarkCommit(b *testing.B) {
	base := b.TempDir()
	l, err := Open([]string{filepath.Join(base, "a"), filepath.Join(base, "b")}, "bench.json", nil)
	if err != nil {
		b.Fatal(err)
	}
	var doc bytes.Buffer
	doc.WriteString(`{"items":[`)
	for i := 0; doc.Len() < 1300<<10; i++ {
		if i > 0 {
			doc.WriteByte(',')
		}
		fmt.Fprintf(&doc, `{"id":"%08d-0000-4000-8000-000000000000","pool_name":"oxp_%08d-0000-4000-8000-000000000000","kind":"crucible"}`, i, i)
	}
	doc.WriteString(`]}`)
	gen := uint64(0)
	for _, checked := range []bool{false, true} {
		// checked: the committer parsed the document already.
		b.Run(fmt.Sprintf("checked=%t", checked), func(b *testing.B) {
			b.SetBytes(int64(doc.Len()))
			for b.Loop() {
				gen++
				if _, err := l.Commit(Record{Generation: gen, Data: doc.Bytes(), Checked: checked}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
