package atomicfile

import (
	"os"
	"path/filepath"
	"testing"
)

func TestWriteFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "sub", "f")
	for _, durable := range []bool{false, true} {
		for _, content := range []string{"one", "two, longer than one", ""} {
			if err := WriteFile(path, []byte(content), Options{Perm: 0o600, Durable: durable}); err != nil {
				t.Fatal(err)
			}
			got, err := os.ReadFile(path)
			if err != nil || string(got) != content {
				t.Fatalf("read %q, %v; want %q", got, err, content)
			}
			if fi, _ := os.Stat(path); fi.Mode().Perm() != 0o600 {
				t.Fatalf("mode %v", fi.Mode())
			}
		}
	}
	ents, _ := os.ReadDir(filepath.Dir(path))
	if len(ents) != 1 {
		t.Fatalf("temp files left: %v", ents)
	}
}

func TestWriteFileIfChanged(t *testing.T) {
	path := filepath.Join(t.TempDir(), "f")
	if err := WriteFileIfChanged(path, []byte("x"), Options{Perm: 0o755}); err != nil {
		t.Fatal(err)
	}
	before, _ := os.Stat(path)
	os.Chmod(path, 0o600)
	if err := WriteFileIfChanged(path, []byte("x"), Options{Perm: 0o755}); err != nil {
		t.Fatal(err)
	}
	after, _ := os.Stat(path)
	if !os.SameFile(before, after) {
		t.Error("unchanged content was rewritten")
	}
	if after.Mode().Perm() != 0o755 {
		t.Errorf("mode %v not fixed", after.Mode())
	}
	if err := WriteFileIfChanged(path, []byte("y"), Options{Perm: 0o755}); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(path); string(got) != "y" {
		t.Errorf("content %q", got)
	}
}

func TestWriteFileFailsCleanly(t *testing.T) {
	dir := t.TempDir()
	blocker := filepath.Join(dir, "file")
	os.WriteFile(blocker, nil, 0o644)
	// A path under a regular file cannot be written.
	if err := WriteFile(filepath.Join(blocker, "f"), []byte("x"), Options{}); err == nil {
		t.Fatal("wrote under a regular file")
	}
	// Renaming over a directory fails, and leaves no temp file behind.
	os.Mkdir(filepath.Join(dir, "d"), 0o755)
	if err := WriteFile(filepath.Join(dir, "d"), []byte("x"), Options{}); err == nil {
		t.Fatal("replaced a directory")
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 2 {
		t.Fatalf("left behind: %v", ents)
	}
}
