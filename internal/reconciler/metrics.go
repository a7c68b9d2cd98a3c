package reconciler

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the reconciler's Prometheus metrics.
type Metrics struct {
	ops       *prometheus.CounterVec
	opSeconds *prometheus.HistogramVec
	passes    prometheus.Counter
	passSecs  prometheus.Histogram
	incidents prometheus.Counter
	relists   *prometheus.CounterVec
	zones     *prometheus.GaugeVec
}

// NewMetrics creates the metrics and registers them with reg (nil: not
// registered anywhere).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		ops: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sled_agent_zone_ops_total",
			Help: "Runtime calls made for zones, by operation and result.",
		}, []string{"op", "result"}),
		opSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "sled_agent_zone_op_seconds",
			Help:    "Duration of runtime calls made for zones.",
			Buckets: prometheus.ExponentialBuckets(0.001, 4, 10),
		}, []string{"op"}),
		passes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sled_agent_reconcile_passes_total",
			Help: "Completed reconciliation passes.",
		}),
		passSecs: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "sled_agent_reconcile_pass_seconds",
			Help:    "Duration of reconciliation passes, from first work to settled.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 4, 12),
		}),
		incidents: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sled_agent_zone_incidents_total",
			Help: "Zones found dead or vanished while they should have been running.",
		}),
		relists: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sled_agent_relists_total",
			Help: "Listings of the zone runtime, by result.",
		}, []string{"result"}),
		zones: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "sled_agent_zones",
			Help: "Zones known to the reconciler, by state.",
		}, []string{"state"}),
	}
	if reg != nil {
		reg.MustRegister(m.ops, m.opSeconds, m.passes, m.passSecs, m.incidents, m.relists, m.zones)
	}
	return m
}
