package api

import (
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

type httpMetrics struct {
	requests *prometheus.CounterVec
	seconds  *prometheus.HistogramVec
}

func newHTTPMetrics(reg prometheus.Registerer) *httpMetrics {
	m := &httpMetrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sled_agent_http_requests_total",
			Help: "HTTP requests served, by route and status code.",
		}, []string{"route", "code"}),
		seconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "sled_agent_http_request_seconds",
			Help:    "Time to serve HTTP requests, by route.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 4, 10),
		}, []string{"route"}),
	}
	reg.MustRegister(m.requests, m.seconds)
	return m
}

func (m *httpMetrics) observe(r *http.Request, route string, code int, d time.Duration) {
	if route == "" {
		route = "unmatched"
	}
	m.requests.WithLabelValues(route, strconv.Itoa(code)).Inc()
	m.seconds.WithLabelValues(route).Observe(d.Seconds())
}
