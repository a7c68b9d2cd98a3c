// Package openapitest checks HTTP exchanges against an upstream OpenAPI
// document with an independent validator (kin-openapi), for tests: what our
// servers answer and our clients send must be what the upstream document
// says, not what our own types happen to produce.
package openapitest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/gorillamux"
)

// Upstream documents, in ../shared/upstream-api beside the repository.
const (
	SledAgent = "sled-agent-48.0.0.json"
	DDM       = "ddm-admin-2.0.0.json"
	DPD       = "dpd-12.0.0.json"
	Propolis  = "propolis-server-6.0.0.json"
	Propolis5 = "propolis-server-5.0.0.json"
	Nexus     = "nexus-internal-1.0.0.json"
)

// formats checks the string and integer formats dropshot's documents use,
// which the validator leaves unchecked unless told.
var formats = []openapi3.SchemaValidationOption{
	openapi3.WithStringFormatValidators(map[string]openapi3.StringFormatValidator{
		"uuid": openapi3.NewRegexpFormatValidator(openapi3.FormatOfStringForUUIDOfRFC9562),
		"ipv4": openapi3.NewIPValidator(true),
		"ipv6": openapi3.NewIPValidator(false),
		"ip": openapi3.NewCallbackValidator(func(s string) error {
			_, err := netip.ParseAddr(s)
			return err
		}),
	}),
	openapi3.WithIntegerFormatValidators(map[string]openapi3.IntegerFormatValidator{
		"uint8":  openapi3.NewRangeFormatValidator[int64](0, math.MaxUint8),
		"uint16": openapi3.NewRangeFormatValidator[int64](0, math.MaxUint16),
		"uint32": openapi3.NewRangeFormatValidator[int64](0, math.MaxUint32),
		"int32":  openapi3.NewRangeFormatValidator[int64](math.MinInt32, math.MaxInt32),
		"int64":  openapi3.NewRangeFormatValidator[int64](math.MinInt64, math.MaxInt64),
	}),
	openapi3.SetSchemaRegexCompiler(func(expr string) (openapi3.RegexMatcher, error) { return compilePattern(expr) }),
}

// Spec is one loaded document.
type Spec struct {
	name   string
	doc    *openapi3.T
	router routers.Router
}

// UpstreamPath returns the path of an upstream document: the repository's
// sibling directory shared/upstream-api, found by walking up from the
// working directory to go.mod.
func UpstreamPath(t testing.TB, name string) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return filepath.Join(dir, "..", "shared", "upstream-api", name)
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatalf("no go.mod above the working directory: cannot find %s", name)
		}
		dir = parent
	}
}

// Load loads an upstream document by name (SledAgent, DDM, DPD, Propolis, Propolis5).
func Load(t testing.TB, name string) *Spec {
	t.Helper()
	path := UpstreamPath(t, name)
	loader := openapi3.NewLoader()
	doc, err := loader.LoadFromFile(path)
	if err != nil {
		t.Fatalf("loading %s: %v", path, err)
	}
	// Match any server: requests go to test servers on loopback.
	doc.Servers = nil
	allowUnitNull(doc)
	router, err := gorillamux.NewRouter(doc)
	if err != nil {
		t.Fatalf("routing %s: %v", path, err)
	}
	return &Spec{name: name, doc: doc, router: router}
}

// allowUnitNull makes the document's unit answers accept their only value.
// Dropshot describes an answer of Rust's () as {"title": "Null", "type":
// "string", "enum": [null]}, which means JSON null but is not nullable in
// OpenAPI 3.0's terms, so the validator would refuse the null that
// dropshot sends. Such a schema is marked nullable; no other is touched.
func allowUnitNull(doc *openapi3.T) {
	for _, item := range doc.Paths.Map() {
		for _, op := range item.Operations() {
			if op.Responses == nil {
				continue
			}
			for _, resp := range op.Responses.Map() {
				if resp.Value == nil {
					continue
				}
				for _, media := range resp.Value.Content {
					if media.Schema == nil || media.Schema.Value == nil {
						continue
					}
					s := media.Schema.Value
					if s.Title == "Null" && len(s.Enum) == 1 && s.Enum[0] == nil {
						s.Nullable = true
					}
				}
			}
		}
	}
}

// Doc is the loaded document.
func (s *Spec) Doc() *openapi3.T { return s.doc }

// Exchange is one request and its answer.
type Exchange struct {
	Request     *http.Request
	RequestBody []byte
	Status      int
	Header      http.Header
	Body        []byte
}

// Check validates an exchange: the request must be an operation of the
// document with valid parameters and body, and the answer a status the
// operation declares (its default response counts) with a valid body. The
// error names the operation and what does not match.
func (s *Spec) Check(x Exchange) error { return s.check(x, true) }

// CheckAnswer validates only the answer of an exchange whose request is
// deliberately not the document's (a missing header, a bad body): the
// answer must still be one the operation declares.
func (s *Spec) CheckAnswer(x Exchange) error { return s.check(x, false) }

func (s *Spec) check(x Exchange, request bool) error {
	ctx := context.Background()
	req := x.Request.Clone(ctx)
	req.Body = io.NopCloser(bytes.NewReader(x.RequestBody))
	route, params, err := s.router.FindRoute(req)
	if err != nil {
		return fmt.Errorf("%s: %s %s is not an operation: %w", s.name, req.Method, req.URL.Path, err)
	}
	op := req.Method + " " + route.Path
	opts := &openapi3filter.Options{
		AuthenticationFunc:      openapi3filter.NoopAuthenticationFunc,
		IncludeResponseStatus:   true,
		MultiError:              true,
		SchemaValidationOptions: formats,
		RegexCompiler:           func(expr string) (openapi3.RegexMatcher, error) { return compilePattern(expr) },
	}
	in := &openapi3filter.RequestValidationInput{Request: req, PathParams: params, Route: route, Options: opts}
	var errs []error
	if !request {
		// The answer's validation needs only the route and the options.
	} else if err := openapi3filter.ValidateRequest(ctx, in); err != nil {
		errs = append(errs, fmt.Errorf("request: %w", err))
	}
	// Validating the request consumed its body: give it back for the
	// response's validation, which may look at it.
	req.Body = io.NopCloser(bytes.NewReader(x.RequestBody))
	header := x.Header
	if header == nil {
		header = http.Header{}
	}
	out := &openapi3filter.ResponseValidationInput{
		RequestValidationInput: in,
		Status:                 x.Status,
		Header:                 header,
		Body:                   io.NopCloser(bytes.NewReader(x.Body)),
		Options:                opts,
	}
	if err := openapi3filter.ValidateResponse(ctx, out); err != nil {
		errs = append(errs, fmt.Errorf("answer %d: %w", x.Status, err))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("%s %s: %w", s.name, op, err)
	}
	return nil
}

// Do sends req with body through client, validates the exchange and
// returns the answer. A failure to send fails the test; a mismatch with the
// document is returned.
func (s *Spec) Do(t testing.TB, client *http.Client, req *http.Request, body []byte) (Exchange, error) {
	t.Helper()
	if body != nil {
		req.Body = io.NopCloser(bytes.NewReader(body))
		req.ContentLength = int64(len(body))
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", req.Method, req.URL, err)
	}
	defer resp.Body.Close()
	got, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: reading the answer: %v", req.Method, req.URL, err)
	}
	x := Exchange{Request: req, RequestBody: body, Status: resp.StatusCode, Header: resp.Header, Body: got}
	return x, s.Check(x)
}

// ValidateValue checks one decoded JSON value against a schema of the
// document, with the same formats and patterns as Check.
func (s *Spec) ValidateValue(schema *openapi3.Schema, v any) error {
	return schema.VisitJSON(v, formats...)
}
