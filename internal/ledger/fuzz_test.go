package ledger

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
)

// fuzzSeeds are the records whose copy files seed FuzzRead. The fuzzer
// cannot forge a SHA-256, so any file Read accepts must hold one of them.
var fuzzSeeds = []Record{
	{Generation: 0, Data: []byte(`{}`)},
	{Generation: 1, Data: []byte(`{"generation":1,"zones":[]}`)},
	{Generation: 12, Data: []byte(`{"a":"<&>\u00e9","b":[1, 2.5e3,null,true]}`)},
	{Generation: 18446744073709551615, Data: []byte(`"a string"`)},
}

// FuzzRead feeds arbitrary bytes as a copy file. Read must not panic, and it
// may only ever return a record that a Commit wrote.
func FuzzRead(f *testing.F) {
	seedDir := f.TempDir()
	seedLedger, err := Open([]string{seedDir}, testName, nil)
	if err != nil {
		f.Fatal(err)
	}
	for _, rec := range fuzzSeeds {
		if _, err := seedLedger.Commit(rec); err != nil {
			f.Fatal(err)
		}
		b, err := os.ReadFile(filepath.Join(seedDir, testName))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
		f.Add(b[:len(b)/2])
		f.Add(bytes.Replace(b, []byte(`"format":1`), []byte(`"format":2`), 1))
	}
	f.Add([]byte{})
	f.Add([]byte("\n"))
	f.Add([]byte(`{"format":1,"generation":1,"sha256":"","data":null}` + "\n"))

	// One ledger and one open copy file per fuzzing process (inputs run one
	// at a time). Each input is written over the copy in place: truncating
	// the file to zero and refilling it costs ~100x more on some file
	// systems, which starves the fuzzer (minimizing an input runs it
	// tens of thousands of times).
	dir := f.TempDir()
	l, err := Open([]string{dir}, testName, nil)
	if err != nil {
		f.Fatal(err)
	}
	copyFile, err := os.OpenFile(filepath.Join(dir, testName), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { copyFile.Close() })

	f.Fuzz(func(t *testing.T, file []byte) {
		if _, err := copyFile.WriteAt(file, 0); err != nil {
			t.Fatal(err)
		}
		if err := copyFile.Truncate(int64(len(file))); err != nil {
			t.Fatal(err)
		}
		rec, st, err := l.Read()
		if len(st) != 1 {
			t.Fatalf("Read returned %d statuses for one copy", len(st))
		}
		if err != nil {
			if st[0].State != StateCorrupt || rec.Data != nil {
				t.Fatalf("Read = %+v, %+v, %v", rec, st, err)
			}
			return
		}
		if st[0].State != StateOK || st[0].Generation != rec.Generation {
			t.Fatalf("Read accepted the copy but status is %+v", st[0])
		}
		// The accepted file's checksum matches its data ...
		var env envelope
		if derr := json.Unmarshal(file, &env); derr != nil || env.SHA256 == nil ||
			*env.SHA256 != checksum(rec.Generation, rec.Data) {
			t.Fatalf("accepted a copy whose checksum does not match its data: %q", file)
		}
		// ... so it is exactly what some Commit wrote.
		for _, s := range fuzzSeeds {
			if s.Generation == rec.Generation && bytes.Equal(s.Data, rec.Data) {
				return
			}
		}
		t.Fatalf("Read returned gen %d %q, which no Commit wrote (file %q)", rec.Generation, rec.Data, file)
	})
}
