package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"os"
	"regexp"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/spf13/cobra"

	"github.com/sled-agent/sled-agent/internal/api"
	"github.com/sled-agent/sled-agent/internal/client"
	"github.com/sled-agent/sled-agent/internal/nat"
	"github.com/sled-agent/sled-agent/internal/probes"
	"github.com/sled-agent/sled-agent/internal/reconciler"
	"github.com/sled-agent/sled-agent/internal/storage"
	"github.com/sled-agent/sled-agent/internal/timesync"
	"github.com/sled-agent/sled-agent/internal/vmm"
)

func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func newConfigCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "config", Short: "Sled config commands"}
	cmd.AddCommand(&cobra.Command{
		Use:         "put FILE",
		Short:       "Put a sled config (OmicronSledConfig JSON; - for standard input)",
		Args:        cobra.ExactArgs(1),
		Annotations: map[string]string{noOutputFlag: "true"},
		RunE: func(cmd *cobra.Command, args []string) error {
			var doc []byte
			var err error
			if args[0] == "-" {
				doc, err = io.ReadAll(io.LimitReader(cmd.InOrStdin(), api.MaxConfigBytes+1))
			} else {
				doc, err = os.ReadFile(args[0])
			}
			if err != nil {
				return fmt.Errorf("reading config: %w", err)
			}
			c, err := client.New(g.url)
			if err != nil {
				return err
			}
			if err := c.PutConfig(cmd.Context(), doc); err != nil {
				return err
			}
			var gen struct {
				Generation uint64 `json:"generation"`
			}
			_ = json.Unmarshal(doc, &gen)
			fmt.Fprintf(cmd.OutOrStdout(), "config generation %d ledgered; zones are being reconciled (see: sled-agent zones)\n", gen.Generation)
			return nil
		},
	})
	return cmd
}

func newInventoryCmd(g *globals) *cobra.Command {
	var upstream bool
	cmd := &cobra.Command{
		Use:   "inventory",
		Short: "Show the sled's inventory: the agent's own view (GET /agent/inventory), or with --upstream upstream's Inventory (GET /inventory) as JSON",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, asJSON, err := g.setup()
			if err != nil {
				return err
			}
			if asJSON || upstream {
				get := c.AgentInventoryRaw
				if upstream {
					get = c.InventoryRaw
				}
				raw, err := get(cmd.Context())
				if err != nil {
					return err
				}
				_, err = fmt.Fprintf(cmd.OutOrStdout(), "%s\n", raw)
				return err
			}
			inv, err := c.AgentInventory(cmd.Context())
			if err != nil {
				return err
			}
			return printInventory(cmd.OutOrStdout(), inv)
		},
	}
	cmd.Flags().BoolVar(&upstream, "upstream", false, "print upstream's Inventory, what the control plane reads (GET /inventory), as JSON")
	return cmd
}

func printInventory(w io.Writer, inv *api.AgentInventory) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "sled\t%s (%s)\n", inv.SledID, inv.SledRole)
	fmt.Fprintf(tw, "agent address\t%s\n", inv.SledAgentAddress)
	if cfg := inv.LedgeredConfig; cfg != nil {
		fmt.Fprintf(tw, "ledgered config\tgeneration %d, %d zones\n", cfg.Generation, cfg.Zones)
	} else {
		fmt.Fprintf(tw, "ledgered config\tnone\n")
	}
	if inv.Ledger.Problem != "" {
		fmt.Fprintf(tw, "ledger problem\t%s\n", inv.Ledger.Problem)
	}
	for _, c := range inv.Ledger.Copies {
		line := c.State
		if c.Generation > 0 {
			line += fmt.Sprintf(" (generation %d)", c.Generation)
		}
		if c.Error != "" {
			line += ": " + c.Error
		}
		fmt.Fprintf(tw, "ledger copy\t%s  %s\n", c.Path, line)
	}
	rs := inv.ReconcilerStatus
	switch rs.Status {
	case "running":
		fmt.Fprintf(tw, "reconciler\trunning for %s (generation %d)\n", seconds(rs.RunningFor), rs.Generation)
	case "idle":
		fmt.Fprintf(tw, "reconciler\tidle; last pass took %s, completed %s\n", seconds(rs.RanFor), rs.CompletedAt.Local().Format(time.DateTime))
	default:
		fmt.Fprintf(tw, "reconciler\t%s\n", rs.Status)
	}
	if lr := inv.LastReconciliation; lr != nil {
		ok := 0
		for _, r := range lr.Zones {
			if r.Result == "ok" {
				ok++
			}
		}
		fmt.Fprintf(tw, "last reconciliation\tgeneration %d: %d/%d zones ok, completed %s\n", lr.Generation, ok, len(lr.Zones), lr.CompletedAt.Local().Format(time.DateTime))
		for _, id := range slices.Sorted(maps.Keys(lr.Zones)) {
			if r := lr.Zones[id]; r.Result != "ok" {
				fmt.Fprintf(tw, "  zone %s\t%s\n", id, r.Message)
			}
		}
	}
	h := inv.VMMHost
	guests := "simulated"
	if h.Accelerator != "" {
		guests = h.Accelerator + " (" + h.AcceleratorWhy + ")"
	}
	fmt.Fprintf(tw, "guests	%s; reservoir %d MiB, %d MiB held\n", guests, h.ReservoirBytes>>20, h.ReservoirUsed>>20)
	for _, v := range inv.VMMs {
		if v.Status == vmm.StatusUnknown {
			fmt.Fprintf(tw, "vmm %s\tunknown: %s\n", v.ID, v.Detail)
			continue
		}
		fmt.Fprintf(tw, "vmm %s\t%s (gen %d) %s\n", v.ID, v.State.State, v.State.Gen, v.Detail)
	}
	if n := inv.Nexus; n != nil {
		at := ""
		if n.LastAnswered != "" {
			at = " at " + n.LastAnswered
		}
		fmt.Fprintf(tw, "nexus\t(found by %s%s) %s\n", n.FoundBy, at, n.Summary())
		for _, d := range n.VMMStates {
			if d.LastError != "" && d.Delivered != d.Latest.Gen {
				fmt.Fprintf(tw, "  vmm %s\tstate gen %d not delivered: %s\n", d.PropolisID, d.Latest.Gen, d.LastError)
			}
		}
	}
	if n := inv.NAT; n != nil {
		found := "switches found by " + n.Discovery.Source
		if n.Discovery.DNSError != "" {
			found += " (DNS: " + n.Discovery.DNSError + ")"
		}
		fmt.Fprintf(tw, "nat\t%s; %d entries wanted\n", found, len(n.Desired))
		for _, z := range n.Ignored {
			fmt.Fprintf(tw, "  ignored\t%s: its NIC is outside the services VPC (VNI %d), so it gets no NAT entry\n", z, nat.ServicesVNI)
		}
		for _, sw := range n.Switches {
			slot := "?"
			if sw.Slot != nil {
				slot = fmt.Sprint(*sw.Slot)
			}
			state := "in place"
			if sw.LastError != "" {
				state = "failing: " + sw.LastError
			} else if sw.LastSuccess == nil {
				state = "not yet checked"
			}
			fmt.Fprintf(tw, "  switch %s (slot %s, %s)\t%d/%d entries; %s\n", sw.Address, slot, sw.FoundBy, sw.Present, sw.Desired, state)
			for _, c := range sw.Conflicts {
				fmt.Fprintf(tw, "    conflict\t%s overlaps an entry not ours (another sled's or an instance's)\n", c)
			}
			for _, k := range sw.Kept {
				fmt.Fprintf(tw, "    kept\t%s: no zone of the config wants it, but zones run that no readable config judges\n", k)
			}
		}
	}
	if d := inv.DDM; d != nil {
		state := "in sync"
		switch {
		case d.LastError != "":
			state = "failing: " + d.LastError
		case !d.InSync:
			state = "not yet in sync"
		}
		fmt.Fprintf(tw, "ddm %s\t%s; wanted %v\n", d.URL, state, d.Desired)
		if len(d.Kept) > 0 {
			fmt.Fprintf(tw, "  kept\t%v: no zone of the config wants them, but zones run that no readable config judges\n", d.Kept)
		}
		if d.ObservedAt != nil {
			fmt.Fprintf(tw, "  last seen in ddm\t%v at %s\n", d.Observed, d.ObservedAt.Local().Format(time.DateTime))
		}
		for _, c := range d.History[max(len(d.History)-5, 0):] {
			fmt.Fprintf(tw, "  %s\t%s %s (%s)\n", c.At.Local().Format(time.DateTime), c.Action, c.Prefix, c.Why)
		}
	}
	if st := inv.Storage; st != nil {
		printStorage(tw, st)
	}
	if ts := inv.TimeSync; ts != nil {
		printTimeSync(tw, ts)
	}
	if p := inv.Probes; p != nil {
		printProbes(tw, p)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w)
	return printZoneTable(w, inv.ZoneStates)
}

func seconds(d *api.Duration) string {
	if d == nil {
		return "?"
	}
	return (time.Duration(d.Secs)*time.Second + time.Duration(d.Nanos)).Round(time.Millisecond).String()
}

func printZoneTable(w io.Writer, zones []api.ZoneSummary) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ZONE\tSTATE\tFOR\tHEALTH\tATTEMPTS\tINCIDENTS\tDETAIL")
	for _, z := range zones {
		state := z.State
		if !z.Wanted {
			state += " (removing)"
		}
		detail := z.LastError
		switch {
		case z.Activity != "":
			detail = z.Activity
		case z.WaitingFor != "":
			// Why it waits; a failure before the wait is in zone show.
			detail = z.WaitingFor
		}
		// Shortened before when it is tried again, which always shows; the
		// root cause first, so that shortening keeps it.
		detail = rootFirst(detail, 100)
		switch {
		case z.NextRetry != nil && z.WaitingFor != "":
			detail += fmt.Sprintf(" [looked at again when it changes, or in %s]", time.Until(*z.NextRetry).Round(time.Second))
		case z.NextRetry != nil:
			detail += fmt.Sprintf(" [retry in %s]", time.Until(*z.NextRetry).Round(time.Second))
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%d\t%s\n", z.Name, state, time.Since(z.Since).Round(time.Second), health(z.Health), z.Attempts, z.Incidents, detail)
	}
	return tw.Flush()
}

// health says what a zone's health checks found, briefly.
func health(h reconciler.Health) string {
	s := string(h.State)
	if h.Failures > 0 {
		s += fmt.Sprintf(" (%d failed)", h.Failures)
	}
	return s
}

// printStorage says how many configured disks and datasets are ok, and what
// is wrong with the others.
func printStorage(tw io.Writer, st *storage.Status) {
	if !st.Configured {
		fmt.Fprintf(tw, "storage\tno storage config yet\n")
		return
	}
	disksOK, datasetsOK := 0, 0
	for _, d := range st.Disks {
		if d.Result.OK {
			disksOK++
		}
	}
	for _, d := range st.Datasets {
		if d.Result.OK {
			datasetsOK++
		}
	}
	fmt.Fprintf(tw, "storage\t%d/%d disks ok, %d/%d datasets ok\n", disksOK, len(st.Disks), datasetsOK, len(st.Datasets))
	if st.ListError != "" {
		fmt.Fprintf(tw, "  listing disks\t%s\n", st.ListError)
	}
	for _, d := range st.Disks {
		if !d.Result.OK {
			fmt.Fprintf(tw, "  disk %s\t%s\n", d.ID, d.Result.Message)
		}
	}
	// A dataset on a pool that is not managed says so, and its disk's line
	// above says why: a few are shown, not every one.
	const most = 5
	bad := 0
	for _, d := range st.Datasets {
		if d.Result.OK {
			continue
		}
		if bad++; bad <= most {
			fmt.Fprintf(tw, "  dataset %s\t%s\n", d.Name, rootFirst(d.Result.Message, 120))
		}
	}
	if bad > most {
		fmt.Fprintf(tw, "  \t… and %d more datasets not ok (-o json shows all)\n", bad-most)
	}
}

// printTimeSync says whether the sled's time is synchronized, and why not.
func printTimeSync(tw io.Writer, ts *timesync.Status) {
	var line string
	switch {
	case ts.Skipped:
		line = "not checked (--skip-timesync)"
	case ts.Synced:
		line = "synchronized"
		if !ts.Since.IsZero() {
			line += " since " + ts.Since.Local().Format(time.DateTime)
		}
		if ts.Source != "" {
			line += fmt.Sprintf("; source %s, stratum %d, offset %gs", ts.Source, ts.Stratum, ts.Offset)
		}
	default:
		line = "not synchronized"
		if ts.Reason != "" {
			line += ": " + ts.Reason
		}
		if ts.Released {
			line += " (it was at " + ts.ReleasedAt.Local().Format(time.DateTime) + "; running zones go on)"
		}
	}
	fmt.Fprintf(tw, "time\t%s\n", line)
}

// uuidRE matches a UUID, shortened in the context of a message.
var uuidRE = regexp.MustCompile(`[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}`)

// rootFirst fits an error message into n runes. One that fits is shown as
// it is. A longer one is a chain "what: context: context: cause" (errors
// wrapped with %w): after what (such as "storage not ready") the root cause
// comes, then the context, innermost first and with its UUIDs shortened, so
// that what is cut off is context, not the cause. A part in parentheses is
// one part, whatever it holds.
func rootFirst(s string, n int) string {
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	parts := splitChain(s)
	if len(parts) < 3 {
		return truncate(s, n)
	}
	shorten := func(p string) string {
		return uuidRE.ReplaceAllStringFunc(p, func(id string) string { return id[:8] + "…" })
	}
	ctx := slices.Clone(parts[1 : len(parts)-1])
	slices.Reverse(ctx)
	for i, p := range ctx {
		ctx[i] = shorten(p)
	}
	root := parts[len(parts)-1]
	out := parts[0] + ": " + root + " (" + strings.Join(ctx, "; ") + ")"
	if utf8.RuneCountInString(out) > n {
		out = parts[0] + ": " + shorten(root) + " (" + strings.Join(ctx, "; ") + ")"
	}
	return truncate(out, n)
}

// splitChain splits an error chain at its ": " separators outside
// parentheses.
func splitChain(s string) []string {
	var parts []string
	depth, start := 0, 0
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '(':
			depth++
		case ')':
			depth = max(depth-1, 0)
		case ':':
			if depth == 0 && strings.HasPrefix(s[i:], ": ") {
				parts = append(parts, s[start:i])
				start = i + 2
				i++
			}
		}
	}
	return append(parts, s[start:])
}

// truncate shortens s to at most n runes.
func truncate(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n-1]) + "…"
}

func newZonesCmd(g *globals) *cobra.Command {
	var runningOnly bool
	cmd := &cobra.Command{
		Use:   "zones",
		Short: "List zones and their states",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, asJSON, err := g.setup()
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			if runningOnly {
				names, err := c.Zones(ctx)
				if err != nil {
					return err
				}
				if asJSON {
					return printJSON(cmd.OutOrStdout(), names)
				}
				for _, n := range names {
					if _, err := fmt.Fprintln(cmd.OutOrStdout(), n); err != nil {
						return err
					}
				}
				return nil
			}
			zones, err := c.ZoneStates(ctx)
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(cmd.OutOrStdout(), zones)
			}
			return printZoneTable(cmd.OutOrStdout(), zones)
		},
	}
	cmd.Flags().BoolVar(&runningOnly, "running", false, "only the names of running zones (GET /zones)")
	return cmd
}

func newVMMCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "vmm", Short: "VMM commands"}
	var yes bool
	remove := &cobra.Command{
		Use:   "remove-unknown ID",
		Short: "Tear down the zone of a VMM the agent has no readable record of",
		Long: `The agent never tears down a VMM zone it has no readable record of (its
record lost or corrupt): it leaves it running and reports it unknown in
sled-agent inventory. This removes one on purpose: its zone, with the guest in
it, and what is left of its record. A VMM the agent has a record of is refused
(the control plane unregisters it).`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if !yes {
				return fmt.Errorf("remove-unknown destroys VMM %s's zone and its guest: pass --yes to do it", args[0])
			}
			c, asJSON, err := g.setup()
			if err != nil {
				return err
			}
			info, err := c.RemoveUnknownVMM(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(cmd.OutOrStdout(), info)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "VMM %s removed: zone %s torn down (%s)\n", info.ID, info.Zone, info.Detail)
			return nil
		},
	}
	remove.Flags().BoolVar(&yes, "yes", false, "really destroy the VMM's zone")
	cmd.AddCommand(remove)
	addVMMCmds(cmd, g)
	return cmd
}

func newZoneCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "zone", Short: "One zone's commands"}
	cmd.AddCommand(&cobra.Command{
		Use:   "show NAME|ID",
		Short: "Show one zone's status and history",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, asJSON, err := g.setup()
			if err != nil {
				return err
			}
			z, err := c.Zone(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if asJSON {
				return printJSON(cmd.OutOrStdout(), z)
			}
			return printZone(cmd.OutOrStdout(), z)
		},
	})
	return cmd
}

func printZone(w io.Writer, z *api.ZoneDetail) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "zone\t%s\n", z.Name)
	fmt.Fprintf(tw, "id\t%s\n", z.ID)
	fmt.Fprintf(tw, "kind\t%s\n", z.Kind)
	wanted := "yes"
	switch {
	case z.RemovedAt != nil:
		wanted = "no: removed from the config, torn down at " + z.RemovedAt.Local().Format(time.DateTime)
	case !z.Wanted:
		wanted = "no (being removed)"
	}
	fmt.Fprintf(tw, "wanted\t%s\n", wanted)
	if z.RemovedAt != nil {
		fmt.Fprintf(tw, "state\tremoved; last %s since %s\n", z.State, z.Since.Local().Format(time.DateTime))
	} else {
		fmt.Fprintf(tw, "state\t%s since %s\n", z.State, z.Since.Local().Format(time.DateTime))
	}
	fmt.Fprintf(tw, "config hash\t%s\n", z.ConfigHash)
	fmt.Fprintf(tw, "attempts\t%d\n", z.Attempts)
	fmt.Fprintf(tw, "incidents\t%d\n", z.Incidents)
	if z.Activity != "" {
		fmt.Fprintf(tw, "doing\t%s\n", z.Activity)
	}
	fmt.Fprintf(tw, "health\t%s\n", health(z.Health))
	if z.Health.LastError != "" {
		fmt.Fprintf(tw, "last health error\t%s\n", z.Health.LastError)
	}
	if z.WaitingFor != "" {
		fmt.Fprintf(tw, "waiting for\t%s\n", z.WaitingFor)
	}
	if z.LastError != "" {
		fmt.Fprintf(tw, "last error\t%s\n", z.LastError)
	}
	switch {
	case z.NextRetry != nil && z.WaitingFor != "":
		fmt.Fprintf(tw, "looked at again\twhen it changes, or at %s\n", z.NextRetry.Local().Format(time.DateTime))
	case z.NextRetry != nil:
		fmt.Fprintf(tw, "next retry\t%s\n", z.NextRetry.Local().Format(time.DateTime))
	}
	fmt.Fprintln(tw, "\nhistory:")
	for _, e := range z.History {
		fmt.Fprintf(tw, "  %s\t%s\t%s\n", e.At.Local().Format("15:04:05.000"), e.Event, e.Detail)
	}
	return tw.Flush()
}

// printProbes says where each probe's zone is and how it stands.
func printProbes(tw io.Writer, st *probes.Status) {
	fmt.Fprintf(tw, "probes\t%d", len(st.Probes))
	if st.LastError != "" {
		fmt.Fprintf(tw, "; failing (%d): %s", st.Failures, rootFirst(st.LastError, 100))
	}
	fmt.Fprintln(tw)
	for _, p := range st.Probes {
		state := p.State
		if p.Adopted {
			state += " (adopted)"
		}
		if p.LastError != "" {
			state += ": " + rootFirst(p.LastError, 100)
		}
		fmt.Fprintf(tw, "  %s\t%s, link %s, in %s\n", p.Zone, state, p.Link, p.Netns)
	}
}
