package simhttp

import (
	"net/http"
	"net/url"
	"slices"
	"strings"

	"github.com/sled-agent/sled-agent/internal/httpbound"
)

// HandlerFunc serves one request; path parameters are in r.PathValue.
type HandlerFunc func(rp *Reply, r *http.Request)

// Router matches requests against patterns like
// "PUT /nat/ipv4/{ip}/{low}/{high}": a method, then a path whose segments
// are literal or a {name} matching one non-empty segment. Unlike
// http.ServeMux it lets the server tell 404 from 405 and answer both with
// the upstream error body, and HEAD is not GET.
type Router struct {
	routes []route
}

type route struct {
	method, path string
	segs         []string
	h            HandlerFunc
	bounds       httpbound.Route
}

// Handle registers h for pattern; it panics on a malformed pattern. Its
// body is bounded by BodyBounds(method).
func (rt *Router) Handle(pattern string, h HandlerFunc) {
	method, path, ok := strings.Cut(pattern, " ")
	if !ok || method == "" || !strings.HasPrefix(path, "/") {
		panic("simhttp: bad pattern " + pattern)
	}
	rt.routes = append(rt.routes, route{method, path, strings.Split(path[1:], "/"), h, BodyBounds(method)})
}

// BodyBounds bounds the body of a request with method: none is taken by
// GET or HEAD (httpbound.Small), MaxBodyBytes by the others (ddm's
// DELETE /prefix takes a body).
func BodyBounds(method string) httpbound.Route {
	if method == http.MethodGet || method == http.MethodHead {
		return httpbound.Small
	}
	return httpbound.Sized(MaxBodyBytes)
}

// Operation is a registered route.
type Operation struct {
	Method, Path string // Path as registered, "/nat/ipv4/{ip}"
	Bounds       httpbound.Route
}

// Operations lists the routes registered.
func (rt *Router) Operations() []Operation {
	if rt == nil {
		return nil
	}
	ops := make([]Operation, len(rt.routes))
	for i, r := range rt.routes {
		ops[i] = Operation{r.method, r.path, r.bounds}
	}
	return ops
}

// match finds r's route. key is the route's path pattern, or the request
// path when no pattern matches the path. h is nil when no route matches
// both method and path; allow then lists the methods the path accepts (nil
// for an unknown path). The path parameters are set on r. bounds is the
// route's body bounds (httpbound.Small when none matched).
func (rt *Router) match(r *http.Request) (key string, h HandlerFunc, allow []string, bounds httpbound.Route) {
	bounds = httpbound.Small
	if rt == nil {
		return r.URL.Path, nil, nil, bounds
	}
	segs := strings.Split(strings.TrimPrefix(r.URL.EscapedPath(), "/"), "/")
	key = r.URL.Path
	for _, rte := range rt.routes {
		params, ok := rte.matchPath(segs)
		if !ok {
			continue
		}
		if rte.method != r.Method {
			if allow == nil {
				key = rte.path
			}
			if !slices.Contains(allow, rte.method) {
				allow = append(allow, rte.method)
			}
			continue
		}
		for name, v := range params {
			r.SetPathValue(name, v)
		}
		return rte.path, rte.h, nil, rte.bounds
	}
	return key, nil, allow, bounds
}

func (rte route) matchPath(segs []string) (map[string]string, bool) {
	if len(segs) != len(rte.segs) {
		return nil, false
	}
	var params map[string]string
	for i, p := range rte.segs {
		seg, err := url.PathUnescape(segs[i])
		if err != nil {
			return nil, false
		}
		if name, ok := strings.CutPrefix(p, "{"); ok {
			if seg == "" {
				return nil, false
			}
			if params == nil {
				params = map[string]string{}
			}
			params[strings.TrimSuffix(name, "}")] = seg
			continue
		}
		if seg != p {
			return nil, false
		}
	}
	return params, true
}
