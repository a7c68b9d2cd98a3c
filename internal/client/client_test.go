package client

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"

	"github.com/sled-agent/sled-agent/internal/api"
	"github.com/sled-agent/sled-agent/internal/vmm"
)

// VMMs follows next_page to the last page, asking for the largest pages.
func TestVMMsFollowsPages(t *testing.T) {
	ids := []string{"a", "b", "c", "d", "e"}
	var mu sync.Mutex
	var asked []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		asked = append(asked, r.URL.RequestURI())
		mu.Unlock()
		if r.URL.Path != "/agent/vmms" || r.Header.Get("api-version") != api.Version {
			http.Error(w, "wrong request", http.StatusBadRequest)
			return
		}
		// Two a page, after the token.
		start := 0
		if tok := r.URL.Query().Get("page_token"); tok != "" {
			start = slices.Index(ids, tok) + 1
		}
		end := min(start+2, len(ids))
		page := api.VMMPage{Items: []vmm.Info{}}
		for _, id := range ids[start:end] {
			page.Items = append(page.Items, vmm.Info{ID: id})
		}
		if end < len(ids) {
			next := ids[end-1]
			page.NextPage = &next
		}
		_ = json.NewEncoder(w).Encode(page)
	}))
	defer srv.Close()
	c, err := New(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	got, err := c.VMMs(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	var gotIDs []string
	for _, v := range got {
		gotIDs = append(gotIDs, v.ID)
	}
	if !slices.Equal(gotIDs, ids) {
		t.Errorf("VMMs = %v, want %v", gotIDs, ids)
	}
	limit := fmt.Sprint(api.MaxVMMPage)
	want := []string{"/agent/vmms?limit=" + limit, "/agent/vmms?limit=" + limit + "&page_token=b", "/agent/vmms?limit=" + limit + "&page_token=d"}
	if !slices.Equal(asked, want) {
		t.Errorf("requests %q, want %q", asked, want)
	}
}
