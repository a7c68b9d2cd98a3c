package client

import (
	"context"
	"net/http"
	"net/url"
)

// What Nexus pushes to every sled about the VPCs of the guests it runs
// (the bodies are upstream's, as Nexus writes them).

// SetVPCFirewallRules replaces the firewall rules of VPC vpcID on the sled
// (PUT /vpc/{vpc_id}/firewall/rules; body a VpcFirewallRulesEnsureBody).
func (c *Client) SetVPCFirewallRules(ctx context.Context, vpcID string, body []byte) error {
	return c.do(ctx, http.MethodPut, "/vpc/"+url.PathEscape(vpcID)+"/firewall/rules", body, nil)
}

// SetVPCRoutes puts the VPC routers' route sets (PUT /vpc-routes; body an
// array of ResolvedVpcRouteSet).
func (c *Client) SetVPCRoutes(ctx context.Context, body []byte) error {
	return c.do(ctx, http.MethodPut, "/vpc-routes", body, nil)
}

// SetV2P puts one virtual-to-physical mapping: where a guest's VPC address
// lives (PUT /v2p; body a VirtualNetworkInterfaceHost).
func (c *Client) SetV2P(ctx context.Context, body []byte) error {
	return c.do(ctx, http.MethodPut, "/v2p", body, nil)
}
