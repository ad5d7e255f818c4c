//go:build unix

// Package linnet is a client for the linnet daemon's socket API
// (docs/api.md): attach an interface to a network and receive its TAP file
// descriptor and addresses, detach it, list what is attached, and manage
// port forwards and connect/listen policies (by address or by DNS name).
// It is for Go VM managers (lima, minikube, …) that want a
// TAP fd and the VM's IP from linnet natively, as they get them from
// vmnet-helper or socket_vmnet on macOS.
//
// Every call takes a context: cancelling it, or its deadline, ends the
// wait for the reply (which the next call reads and drops), as
// Client.Timeout does.
//
// A Client is one connection, and the connection is the lifeline of every
// interface attached on it: closing the Client (or the process exiting)
// detaches them. Keep it open as long as the VMs run, or hand it on with
// File. A Client serves one request at a time; it is safe for use by
// several goroutines.
//
// The daemon and the TAP devices it hands out are Linux's. The package
// builds on other Unix systems too (lima imports it on macOS), where Dial
// says the daemon is not there to be had.
package linnet

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"syscall"
	"time"
)

// DefaultSocket is where the daemon listens unless LINNET_RUN_DIR moves it.
const DefaultSocket = "/run/linnet/linnet.sock"

// maxPacket is the largest packet the daemon sends (docs/api.md).
const maxPacket = 64 << 10

// maxLargeReply bounds a reply announced by {"large_message": N}; a var
// for the tests.
var maxLargeReply = 64 << 20

// SocketPath is the daemon's socket: $LINNET_RUN_DIR/linnet.sock when that
// is set, else DefaultSocket.
func SocketPath() string {
	if dir := os.Getenv("LINNET_RUN_DIR"); dir != "" {
		return filepath.Join(dir, "linnet.sock")
	}
	return DefaultSocket
}

// RootlessSocketPath is the socket of the user's own rootless daemon
// ($XDG_RUNTIME_DIR/linnet/linnet.sock; `linnet daemon --rootless`, which
// `linnet run` starts), or "" when XDG_RUNTIME_DIR is not set.
func RootlessSocketPath() string {
	dir := os.Getenv("XDG_RUNTIME_DIR")
	if dir == "" {
		return ""
	}
	return filepath.Join(dir, "linnet", "linnet.sock")
}

// The kinds of the daemon's refusals (Error.Kind).
const (
	// KindBadRequest: the request itself is wrong (a bad name, MAC, rule).
	KindBadRequest = "bad_request"
	// KindUnknownNetwork: no such network in the daemon's networks.yaml.
	KindUnknownNetwork = "unknown_network"
	// KindNotAllowed: the network's allow list, or another user's interface.
	KindNotAllowed = "not_allowed"
	// KindBusy: a limit, or an interface held by another connection; try
	// again later.
	KindBusy = "busy"
	// KindConflict: something on the host or another attach is in the way.
	KindConflict = "conflict"
	// KindHostSetup: the host lacks what the request needs (a module, a
	// tool).
	KindHostSetup = "host_setup"
	// KindInternal: the daemon failed; its log says why.
	KindInternal = "internal"
)

// Error is the daemon's refusal of a request. Kind (one of the Kind
// constants) is for programs; Message is for people and names the fix.
type Error struct {
	Kind    string `json:"kind"`
	Message string `json:"message"`
}

func (e *Error) Error() string { return fmt.Sprintf("linnet: %s: %s", e.Kind, e.Message) }

// Client is a connection to the daemon.
type Client struct {
	// Timeout bounds each call (0: none). A call that times out leaves its
	// reply owed: the next call reads and drops it first, so the
	// connection, and the interfaces it holds, stay usable.
	Timeout time.Duration

	mu   sync.Mutex
	conn *net.UnixConn
	// Replies of timed-out calls still to come.
	owed int
	// Why the connection can no longer be used (its replies out of step).
	broken error
}

// Dial connects to the daemon's socket at path ("" for SocketPath()).
func Dial(path string) (*Client, error) {
	if runtime.GOOS != "linux" {
		return nil, fmt.Errorf("linnet: the linnet daemon runs on Linux, not %s: there is no daemon to connect to here", runtime.GOOS)
	}
	if path == "" {
		path = SocketPath()
	}
	conn, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: path, Net: "unixpacket"})
	if err != nil {
		return nil, fmt.Errorf("linnet: cannot connect to the daemon at %s (is `linnet daemon` running, and may you use it?): %w", path, err)
	}
	return &Client{conn: conn}, nil
}

// NewClient uses an already connected SOCK_SEQPACKET socket.
func NewClient(conn *net.UnixConn) *Client { return &Client{conn: conn} }

// Close closes the connection, which detaches every interface attached on it.
func (c *Client) Close() error { return c.conn.Close() }

// File returns a duplicate of the connection. The interfaces live as long
// as any copy of it is open: a VM manager that starts a VMM and exits can
// pass it in exec.Cmd.ExtraFiles, so the VM's network lasts as long as the
// VMM (which need not use it).
func (c *Client) File() (*os.File, error) { return c.conn.File() }

// AttachRequest is what an attach asks for; every field is optional.
type AttachRequest struct {
	Network     string   `json:"network,omitempty"`
	InterfaceID string   `json:"interface_id,omitempty"`
	MAC         string   `json:"mac,omitempty"`
	Name        string   `json:"name,omitempty"`
	Datapath    string   `json:"datapath,omitempty"` // tap (default), tap-name, dgram, stream or vhost-user
	Publish     []string `json:"publish,omitempty"`  // e.g. "8080:80/tcp"
	// Keep keeps the interface after this connection closes (tap-name only),
	// until a Detach by its owner or root (`linnet attach`).
	Keep bool `json:"keep,omitempty"`
	// CloneOf attaches a clone of a VM restored from a snapshot
	// (docs/clones.md): the name of a VM of the network, or a *CloneGuest.
	CloneOf any `json:"clone_of,omitempty"`
	// Policy limits what the VM may connect to and be connected on; nil:
	// the network's (`policy:` in networks.yaml).
	Policy *Policy `json:"policy,omitempty"`
}

// Policy is an interface's connect/listen policy (docs/policy.md). Egress
// rules are "CIDR|NAME[:PORT[-PORT]][/tcp|/udp]": an address or network
// ("198.51.100.1:8080/tcp", "10.0.0.0/8"), or a DNS name
// ("api.example.com:443", "*.cdn.example.net:443/tcp": any name one label
// or more below), whose addresses the VM may reach once linnet's DNS has
// answered it for the name; a VM with names asks no other resolver.
// Ingress rules are "PORT[-PORT][/tcp|/udp]". An empty list restricts
// nothing. RateLimit caps the VM's traffic each way. Secrets are rules
// "NAME@HOST" letting linnet put the VM's owner's secret NAME where the
// VM's HTTPS requests to HOST say {{secret:NAME}} (docs/secrets.md);
// NetworkSecrets are the network's, which the daemon alone sets (what a
// request says there is replaced).
type Policy struct {
	Egress         []string   `json:"egress,omitempty"`
	Ingress        []string   `json:"ingress,omitempty"`
	RateLimit      *RateLimit `json:"rate_limit,omitempty"`
	Secrets        []string   `json:"secrets,omitempty"`
	NetworkSecrets []string   `json:"network_secrets,omitempty"`
}

// RateLimit is an interface's rate limits, each "RATE[/BURST]" in bits per
// second with an optional burst in bytes ("100mbit", "20mbit/512kib");
// empty: that way is not limited. In is what the VM receives, Out what it
// sends. In an attach, an empty way takes the network's rate_limit.
type RateLimit struct {
	In  string `json:"in,omitempty"`
	Out string `json:"out,omitempty"`
}

// PolicyPart names the part of a policy PolicySetPart changes.
type PolicyPart string

// The parts of a policy.
const (
	PartRules     PolicyPart = "rules"
	PartRateLimit PolicyPart = "rate_limit"
)

// LearnedAddress is an address a VM may reach because linnet's DNS
// answered it for a name of its policy, until it expires.
type LearnedAddress struct {
	// Name is the name asked; empty for an address the daemon found in
	// its firewall after a restart.
	Name      string `json:"name,omitempty"`
	Address   string `json:"address"`
	ExpiresIn uint64 `json:"expires_in"` // seconds
}

// Enforcement says which parts of an interface's policy its network
// enforces (networks.yaml's enforced: true): the most its VM may have,
// which its owner may narrow and never widen.
type Enforcement struct {
	Policy    bool   `json:"policy"`
	RateLimit bool   `json:"rate_limit"`
	By        string `json:"by"` // the file that enforces them
}

// PolicyInfo is an interface's policy and what it learned by name.
type PolicyInfo struct {
	InterfaceID string           `json:"interface_id"`
	Policy      Policy           `json:"policy"`
	Learned     []LearnedAddress `json:"learned,omitempty"`
	// Enforced is nil when its network enforces nothing of it.
	Enforced *Enforcement `json:"enforced,omitempty"`
}

// InterfaceRef names an interface on a network by exactly one of its id
// and its name.
type InterfaceRef struct {
	Network     string `json:"network"`
	InterfaceID string `json:"interface_id,omitempty"`
	Name        string `json:"name,omitempty"`
}

// PolicyShow returns an interface's policy and the addresses it learned.
func (c *Client) PolicyShow(ctx context.Context, ref InterfaceRef) (*PolicyInfo, error) {
	body := struct {
		Op string `json:"op"`
		InterfaceRef
	}{"policy_show", ref}
	var info PolicyInfo
	if _, err := c.call(ctx, body, "policy", &info); err != nil {
		return nil, err
	}
	return &info, nil
}

// PolicySet replaces an interface's policy: new connections follow it at
// once, and addresses learned for names it no longer allows are dropped.
func (c *Client) PolicySet(ctx context.Context, ref InterfaceRef, p Policy) (*PolicyInfo, error) {
	return c.PolicySetPart(ctx, ref, p, "")
}

// PolicySetPart changes only one part of an interface's policy, its rules
// (PartRules) or its rate limits (PartRateLimit), from p, and keeps the
// other; "" replaces the whole policy, as PolicySet does.
func (c *Client) PolicySetPart(ctx context.Context, ref InterfaceRef, p Policy, only PolicyPart) (*PolicyInfo, error) {
	body := struct {
		Op string `json:"op"`
		InterfaceRef
		Policy Policy     `json:"policy"`
		Only   PolicyPart `json:"only,omitempty"`
	}{"policy_set", ref, p, only}
	var info PolicyInfo
	if _, err := c.call(ctx, body, "policy", &info); err != nil {
		return nil, err
	}
	return &info, nil
}

// CloneGuest is the snapshotted VM as recorded (its interface JSON): what a
// clone keeps.
type CloneGuest struct {
	MACAddress string `json:"mac_address"`
	IPAddress  string `json:"ip_address"`
	TAP        string `json:"tap,omitempty"`
}

// Interface is an attached interface, as the attach reply describes it.
// Optional addresses are empty when the network has none (ipv6: false,
// dhcp: false without a static lease) and on a LAN network (mode bridged or
// bridge), whose addresses the LAN's DHCP server gives: WaitAddress.
type Interface struct {
	InterfaceID string   `json:"interface_id"`
	Network     string   `json:"network"`
	Mode        string   `json:"mode"`
	Datapath    string   `json:"datapath"`
	Name        string   `json:"name,omitempty"`
	MACAddress  string   `json:"mac_address"`
	IPAddress   string   `json:"ip_address,omitempty"`
	Gateway     string   `json:"gateway,omitempty"`
	Subnet      string   `json:"subnet,omitempty"`
	DNS         []string `json:"dns"`
	Domain      string   `json:"domain"`
	IPv6Prefix  string   `json:"ipv6_prefix,omitempty"`
	IPv6Address string   `json:"ipv6_address,omitempty"`
	Gateway6    string   `json:"gateway6,omitempty"`
	TAP         string   `json:"tap"`
	MTU         int      `json:"mtu"`
	Forwards    []string `json:"forwards"`
	// HostLoopback is, on a rootless daemon's network with NAT, the
	// address at which the VM reaches the host's 127.0.0.1.
	HostLoopback string `json:"host_loopback,omitempty"`
	// CloneAddress is a clone's own address, at which the host and other
	// VMs reach it (IPAddress is the guest's, which its clones share).
	CloneAddress string `json:"clone_address,omitempty"`
	// Netns is a tap-name clone's network namespace, where its VMM must
	// run to open TAP by name.
	Netns    string   `json:"netns,omitempty"`
	Warnings []string `json:"warnings,omitempty"`
	// ReclaimToken re-claims the interface on a new connection after the
	// daemon restarted (Reclaim). Empty for a clone. Keep it to yourself.
	ReclaimToken string `json:"-"`
	// Raw is the whole reply object, vmnet_* keys included.
	Raw json.RawMessage `json:"-"`
}

// Attach attaches an interface. The interface lives until Detach or Close.
// The returned file, by req.Datapath:
//   - "tap" (the default): the TAP, opened with IFF_TAP|IFF_NO_PI|IFF_VNET_HDR
//     (a 10-byte virtio-net header unless the VMM sets TUNSETVNETHDRSZ):
//     hand it to the VMM (QEMU's -netdev tap,fd=, Cloud Hypervisor,
//     crosvm) and close yours once the VMM holds it;
//   - "tap-name": no file (nil): the persistent TAP named Interface.TAP,
//     which the VMM (Firecracker) opens by that name, as the attaching
//     user (the daemon closed its own before replying, so the TAP is
//     free for it);
//   - "dgram" and "stream": the TAP too, which the caller relays to its
//     VMM's unix socket itself (as `linnet helper` does), with the framing
//     that datapath names; "vhost-user": the TAP, for the caller's own
//     vhost-user back-end (`linnet helper --vhost-user` is linnet's);
//   - on a network in mode "bridged": a macvtap's character device,
//     used as a TAP fd.
func (c *Client) Attach(ctx context.Context, req AttachRequest) (*Interface, *os.File, error) {
	body := struct {
		Op string `json:"op"`
		AttachRequest
	}{"attach", req}
	var reply struct {
		Interface    json.RawMessage `json:"interface"`
		ReclaimToken string          `json:"reclaim_token"`
	}
	fds, err := c.call(ctx, body, "attached", &reply)
	if err != nil {
		return nil, nil, err
	}
	tapName := req.Datapath == "tap-name"
	if tapName {
		// An earlier daemon sent one: closed, as the VMM must be its only opener.
		closeAll(fds)
		fds = nil
	} else if len(fds) != 1 {
		closeAll(fds)
		c.abandon(reply.Interface)
		return nil, nil, fmt.Errorf("linnet: the attach reply carried %d file descriptors, not the TAP's one", len(fds))
	}
	var iface Interface
	if err := json.Unmarshal(reply.Interface, &iface); err != nil || iface.InterfaceID == "" {
		closeAll(fds)
		c.abandon(reply.Interface)
		return nil, nil, fmt.Errorf("linnet: a malformed interface in the attach reply (%v): %s", err, reply.Interface)
	}
	iface.Raw = reply.Interface
	iface.ReclaimToken = reply.ReclaimToken
	if tapName {
		return &iface, nil, nil
	}
	return &iface, os.NewFile(uintptr(fds[0]), "linnet-tap-"+iface.TAP), nil
}

// abandon detaches, as best it can, an interface whose attach reply was
// unusable, so that it does not stay attached unseen until Close.
func (c *Client) abandon(raw json.RawMessage) {
	var id struct {
		InterfaceID string `json:"interface_id"`
	}
	if json.Unmarshal(raw, &id) == nil && id.InterfaceID != "" {
		// Whatever became of the attach's context.
		_ = c.Detach(context.Background(), id.InterfaceID)
	}
}

// Detach detaches an interface this connection attached.
func (c *Client) Detach(ctx context.Context, interfaceID string) error {
	_, err := c.call(ctx, map[string]string{"op": "detach", "interface_id": interfaceID}, "detached", nil)
	return err
}

// Reclaim makes an interface that this client attached on a connection to
// an earlier daemon this connection's: a daemon that restarts keeps running
// VMs' interfaces, and their clients Dial again (until a daemon answers)
// and re-claim them with the attach reply's token. From then on the
// interface lives until Detach or Close on this connection. An error of
// kind bad_request means the new daemon did not keep it.
func (c *Client) Reclaim(ctx context.Context, interfaceID, token string) error {
	_, err := c.call(ctx, map[string]string{"op": "reclaim", "interface_id": interfaceID, "token": token}, "reclaimed", nil)
	return err
}

// WaitAddress waits up to timeout for an interface's IPv4 address: at once
// on linnet's own networks, on a LAN once linnet has seen the LAN's DHCP
// server give it. The connection waits with it: use one of its own.
func (c *Client) WaitAddress(ctx context.Context, network, interfaceID string, timeout time.Duration) (string, error) {
	body := struct {
		Op          string `json:"op"`
		Network     string `json:"network"`
		InterfaceID string `json:"interface_id"`
		TimeoutMS   int64  `json:"timeout_ms"`
	}{"wait_address", network, interfaceID, timeout.Milliseconds()}
	var reply struct {
		IPAddress string `json:"ip_address"`
	}
	if _, err := c.callWithin(ctx, body, "address", &reply, timeout); err != nil {
		return "", err
	}
	return reply.IPAddress, nil
}

// Network is a configured network as `list` describes it.
type Network struct {
	Name string `json:"name"`
	Mode string `json:"mode"` // shared, host, bridged or bridge
	// Subnet and Gateway are linnet's own networks'; empty on a LAN.
	Subnet  string `json:"subnet,omitempty"`
	Gateway string `json:"gateway,omitempty"`
	// LAN is a LAN network's host NIC (bridged) or bridge (bridge).
	LAN        string  `json:"lan,omitempty"`
	IPv6Prefix string  `json:"ipv6_prefix,omitempty"`
	Bridge     *string `json:"bridge"` // nil while the network is down
	Interfaces int     `json:"interfaces"`
	Persistent bool    `json:"persistent"`
	// Socket is its socket_vmnet-compatible socket (docs/lima.md), if any:
	// lima's `networks: - socket:` or QEMU's -netdev stream connect there.
	Socket   string   `json:"socket,omitempty"`
	Warnings []string `json:"warnings,omitempty"`
}

// Listed is an attached interface as `list` describes it.
type Listed struct {
	InterfaceID string   `json:"interface_id"`
	Name        string   `json:"name,omitempty"`
	Network     string   `json:"network"`
	MACAddress  string   `json:"mac_address"`
	IPAddress   string   `json:"ip_address,omitempty"`
	IPv6Address string   `json:"ipv6_address,omitempty"`
	TAP         string   `json:"tap"`
	Forwards    []string `json:"forwards"`
	ClientPID   int      `json:"client_pid"`
	ClientUID   int      `json:"client_uid"`
	Datapath    string   `json:"datapath"`
	VMRxBytes   uint64   `json:"vm_rx_bytes"`
	VMTxBytes   uint64   `json:"vm_tx_bytes"`
	Policy      *Policy  `json:"policy,omitempty"`
	// RefusedQueries counts DNS queries for names its policy does not
	// allow (nil: no names in its policy); RefusedConnections the
	// connection attempts its egress policy refused (nil: none).
	RefusedQueries     *uint64 `json:"refused_queries,omitempty"`
	RefusedConnections *uint64 `json:"refused_connections,omitempty"`
}

// Listing is the reply to List.
type Listing struct {
	Networks   []Network `json:"networks"`
	Interfaces []Listed  `json:"interfaces"`
}

// List lists every configured network and every attached interface.
func (c *Client) List(ctx context.Context) (*Listing, error) {
	var l Listing
	if _, err := c.call(ctx, map[string]string{"op": "list"}, "listing", &l); err != nil {
		return nil, err
	}
	return &l, nil
}

// Forward is a port forward as forward_list describes it.
type Forward struct {
	Network     string `json:"network"`
	InterfaceID string `json:"interface_id"`
	Name        string `json:"name,omitempty"`
	Forward     string `json:"forward"`
	Guest       string `json:"guest"`
	Guest6      string `json:"guest6,omitempty"`
	Origin      string `json:"origin"` // publish, runtime or config
}

// ForwardRef names an interface on a network by exactly one of its id and
// its name, and a forward in forwarding.md's syntax ("9090:80/tcp").
type ForwardRef struct {
	Network     string `json:"network"`
	InterfaceID string `json:"interface_id,omitempty"`
	Name        string `json:"name,omitempty"`
	Forward     string `json:"forward"`
}

// ForwardAdd publishes a port of an interface on the host.
func (c *Client) ForwardAdd(ctx context.Context, f ForwardRef) error {
	return c.forward(ctx, "forward_add", f)
}

// ForwardRemove removes a forward that ForwardAdd (or an attach's Publish)
// made.
func (c *Client) ForwardRemove(ctx context.Context, f ForwardRef) error {
	return c.forward(ctx, "forward_remove", f)
}

func (c *Client) forward(ctx context.Context, op string, f ForwardRef) error {
	body := struct {
		Op string `json:"op"`
		ForwardRef
	}{op, f}
	_, err := c.call(ctx, body, "ok", nil)
	return err
}

// SecretSet sets the caller's secret name to value, or with network set
// (root only) that network's; setting one that exists replaces its value,
// for the next request that uses it.
func (c *Client) SecretSet(ctx context.Context, name, value, network string) error {
	body := struct {
		Op      string `json:"op"`
		Name    string `json:"name"`
		Value   string `json:"value"`
		Network string `json:"network,omitempty"`
	}{"secret_set", name, value, network}
	_, err := c.call(ctx, body, "ok", nil)
	return err
}

// SecretRemove removes the caller's secret name, or the network's.
func (c *Client) SecretRemove(ctx context.Context, name, network string) error {
	body := struct {
		Op      string `json:"op"`
		Name    string `json:"name"`
		Network string `json:"network,omitempty"`
	}{"secret_remove", name, network}
	_, err := c.call(ctx, body, "ok", nil)
	return err
}

// Secret is a secret as listed: its owner and name, never its value.
type Secret struct {
	// Owner is {"uid": N} or {"network": NAME}.
	Owner   SecretOwner `json:"owner"`
	Name    string      `json:"name"`
	SetAtMs uint64      `json:"set_at_ms"`
}

// SecretOwner is whose a secret is: a user's (UID) or a network's.
type SecretOwner struct {
	UID     *uint32 `json:"uid,omitempty"`
	Network string  `json:"network,omitempty"`
}

// SecretList lists the secrets the caller may see: its own and those of
// the networks it may attach to (root: all).
func (c *Client) SecretList(ctx context.Context) ([]Secret, error) {
	var reply struct {
		Secrets []Secret `json:"secrets"`
	}
	if _, err := c.call(ctx, map[string]string{"op": "secret_list"}, "secrets", &reply); err != nil {
		return nil, err
	}
	return reply.Secrets, nil
}

// CA returns network's secrets CA certificate (PEM), made the first time
// it is asked for: what a guest installs so linnet can put secrets into its
// HTTPS requests (docs/secrets.md).
func (c *Client) CA(ctx context.Context, network string) (string, error) {
	var reply struct {
		Certificate string `json:"certificate"`
	}
	body := map[string]string{"op": "ca", "network": network}
	if _, err := c.call(ctx, body, "ca", &reply); err != nil {
		return "", err
	}
	return reply.Certificate, nil
}

// ForwardList lists every forward.
func (c *Client) ForwardList(ctx context.Context) ([]Forward, error) {
	var reply struct {
		Forwards []Forward `json:"forwards"`
	}
	if _, err := c.call(ctx, map[string]string{"op": "forward_list"}, "forwards", &reply); err != nil {
		return nil, err
	}
	return reply.Forwards, nil
}

// call sends one request and reads its reply: `want` is the reply's kind,
// `out` (if not nil) takes its fields. It returns the file descriptors that
// came with the reply.
func (c *Client) call(ctx context.Context, request interface{}, want string, out interface{}) ([]int, error) {
	return c.callWithin(ctx, request, want, out, 0)
}

// callWithin is call for a request the daemon answers only after `waits`
// (wait_address): the call's Timeout comes on top of it.
func (c *Client) callWithin(ctx context.Context, request interface{}, want string, out interface{}, waits time.Duration) ([]int, error) {
	msg, err := json.Marshal(request)
	if err != nil {
		return nil, err
	}
	if len(msg) > maxPacket {
		return nil, fmt.Errorf("linnet: a request of %d bytes, more than the %d the daemon reads", len(msg), maxPacket)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.broken != nil {
		return nil, c.broken
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("linnet: %w", err)
	}
	var deadline time.Time
	if c.Timeout > 0 {
		deadline = time.Now().Add(c.Timeout + waits)
	}
	if d, ok := ctx.Deadline(); ok && (deadline.IsZero() || d.Before(deadline)) {
		deadline = d
	}
	if err := c.conn.SetDeadline(deadline); err != nil {
		return nil, err
	}
	// Cancelled: the read in progress ends at once, as at a timeout (the
	// reply is owed, and read and dropped by the next call).
	defer c.endOnCancel(ctx)()
	for c.owed > 0 {
		_, fds, err := c.receive()
		if isTimeout(err) {
			return nil, fmt.Errorf("linnet: an earlier call's reply has still not come: %w", err)
		}
		if err != nil {
			return nil, c.fail(err)
		}
		closeAll(fds)
		c.owed--
	}
	body, fds, err := c.exchange(msg)
	if err != nil {
		err = c.fail(err)
		if ctx.Err() != nil {
			return nil, fmt.Errorf("linnet: the call was given up (%w); the next call reads and drops its reply", ctx.Err())
		}
		return nil, err
	}
	var head struct {
		Reply string `json:"reply"`
		Error
	}
	if err := json.Unmarshal(body, &head); err != nil {
		closeAll(fds)
		return nil, fmt.Errorf("linnet: a reply that is not JSON: %w", err)
	}
	if head.Reply == "error" {
		closeAll(fds)
		e := head.Error
		return nil, &e
	}
	if head.Reply != want {
		closeAll(fds)
		return nil, fmt.Errorf("linnet: expected a %q reply, got %q", want, head.Reply)
	}
	if out != nil {
		if err := json.Unmarshal(body, out); err != nil {
			closeAll(fds)
			return nil, fmt.Errorf("linnet: a malformed %q reply: %w", want, err)
		}
	}
	return fds, nil
}

// endOnCancel ends the connection's read or write in progress (as at a
// timeout) once ctx is cancelled; the function it returns stops watching.
func (c *Client) endOnCancel(ctx context.Context) func() {
	done := ctx.Done()
	if done == nil {
		return func() {}
	}
	stop := make(chan struct{})
	go func() {
		select {
		case <-done:
			_ = c.conn.SetDeadline(time.Now())
		case <-stop:
		}
	}()
	return func() { close(stop) }
}

// exchange sends a request and receives its reply. A daemon that refused
// the connection (a user over its connection limit gets `busy`) has sent
// why before closing: a failed write reads it.
func (c *Client) exchange(msg []byte) ([]byte, []int, error) {
	if _, err := c.conn.Write(msg); err != nil {
		if errors.Is(err, syscall.EPIPE) || errors.Is(err, syscall.ECONNRESET) {
			if body, fds, rerr := c.receive(); rerr == nil {
				return body, fds, nil
			}
		}
		return nil, nil, fmt.Errorf("linnet: cannot send the request: %w", err)
	}
	return c.receive()
}

// fail records what a failed exchange leaves: a timed-out call still owes
// its reply; anything else that broke off mid-reply leaves the connection's
// replies out of step, so it is not used again.
func (c *Client) fail(err error) error {
	switch {
	case isTimeout(err):
		c.owed++
		return fmt.Errorf("linnet: no reply within %v (the next call takes it first): %w", c.Timeout, err)
	case errors.Is(err, errOutOfStep):
		c.broken = err
	}
	return err
}

func isTimeout(err error) bool {
	var timeout net.Error
	return errors.As(err, &timeout) && timeout.Timeout()
}

// errOutOfStep marks a reply read only in part.
var errOutOfStep = errors.New("the connection's replies are out of step")

// receive reads one reply: a packet, or a {"large_message": N} packet and
// the N bytes that follow in packets of their own. A reply too large to
// take is read to its end and dropped, so the next reply is the next
// call's.
func (c *Client) receive() ([]byte, []int, error) {
	buf := make([]byte, maxPacket)
	n, fds, err := c.packet(buf)
	if err != nil {
		return nil, nil, err
	}
	var large struct {
		LargeMessage *int `json:"large_message"`
	}
	if json.Unmarshal(buf[:n], &large) != nil || large.LargeMessage == nil {
		return buf[:n], fds, nil
	}
	size := *large.LargeMessage
	if size < 0 {
		closeAll(fds)
		return nil, nil, fmt.Errorf("linnet: %w: a reply of %d bytes announced", errOutOfStep, size)
	}
	var body []byte
	if size <= maxLargeReply {
		body = make([]byte, 0, size)
	}
	for got := 0; got < size; {
		n, more, err := c.packet(buf)
		closeAll(more)
		if err != nil {
			closeAll(fds)
			return nil, nil, fmt.Errorf("linnet: %w: the reply broke off after %d of %d bytes: %v", errOutOfStep, got, size, err)
		}
		got += n
		if body != nil {
			body = append(body, buf[:n]...)
		}
	}
	if body == nil {
		closeAll(fds)
		return nil, nil, fmt.Errorf("linnet: a reply of %d bytes, more than %d; dropped", size, maxLargeReply)
	}
	if len(body) != size {
		closeAll(fds)
		return nil, nil, fmt.Errorf("linnet: %w: a reply of %d bytes announced, %d came", errOutOfStep, size, len(body))
	}
	return body, fds, nil
}

// packet reads one packet into buf, with the file descriptors that came
// with it.
func (c *Client) packet(buf []byte) (int, []int, error) {
	oob := make([]byte, syscall.CmsgSpace(4*4))
	n, oobn, flags, _, err := c.conn.ReadMsgUnix(buf, oob)
	if errors.Is(err, io.EOF) {
		return 0, nil, errors.New("linnet: the daemon closed the connection")
	}
	if err != nil {
		return 0, nil, fmt.Errorf("linnet: cannot read the reply: %w", err)
	}
	fds, err := rights(oob[:oobn])
	if err != nil {
		return 0, nil, err
	}
	if flags&(syscall.MSG_TRUNC|syscall.MSG_CTRUNC) != 0 {
		closeAll(fds)
		return 0, nil, fmt.Errorf("linnet: %w: a packet was cut short", errOutOfStep)
	}
	return n, fds, nil
}

// rights takes the file descriptors out of a message's control data.
func rights(oob []byte) ([]int, error) {
	msgs, err := syscall.ParseSocketControlMessage(oob)
	if err != nil {
		return nil, fmt.Errorf("linnet: malformed control data with a reply: %w", err)
	}
	var fds []int
	for i := range msgs {
		if msgs[i].Header.Level == syscall.SOL_SOCKET && msgs[i].Header.Type == syscall.SCM_RIGHTS {
			got, err := syscall.ParseUnixRights(&msgs[i])
			if err != nil {
				closeAll(fds)
				return nil, fmt.Errorf("linnet: malformed file descriptors with a reply: %w", err)
			}
			fds = append(fds, got...)
		}
	}
	return fds, nil
}

func closeAll(fds []int) {
	for _, fd := range fds {
		syscall.Close(fd)
	}
}

// Event is one change the daemon tells of (docs/operations.md): Event names
// its kind (the Event* constants), and the fields its kind has are set.
type Event struct {
	// TimeMs is when it happened, in Unix milliseconds.
	TimeMs int64 `json:"time_ms"`
	// Network is where; empty for the daemon's own (dropped).
	Network     string `json:"network,omitempty"`
	Event       string `json:"event"`
	InterfaceID string `json:"interface_id,omitempty"`
	Name        string `json:"name,omitempty"`
	MACAddress  string `json:"mac_address,omitempty"`
	IPAddress   string `json:"ip_address,omitempty"`
	TAP         string `json:"tap,omitempty"`
	Datapath    string `json:"datapath,omitempty"`
	// UID is who attached (attached).
	UID *uint32 `json:"uid,omitempty"`
	// Hostname is what the guest sent in DHCP (lease).
	Hostname string `json:"hostname,omitempty"`
	// Reason says why the VM was cut off (cut_off).
	Reason string  `json:"reason,omitempty"`
	Policy *Policy `json:"policy,omitempty"`
	// Forward and Added: a port published (true) or withdrawn (forward).
	Forward string `json:"forward,omitempty"`
	Added   bool   `json:"added,omitempty"`
	// Count is how many events a slow reader missed (dropped).
	Count uint64 `json:"count,omitempty"`
	// Asked, Allowed and Learned: a name a VM with names in its policy
	// asked linnet's DNS for, whether it was answered, and what the answer
	// let it reach for how long (name). HeldBack counts this VM's records
	// not given (over its budget) since its last.
	Asked    string      `json:"asked,omitempty"`
	Allowed  bool        `json:"allowed,omitempty"`
	Learned  []Reachable `json:"learned,omitempty"`
	HeldBack uint64      `json:"held_back,omitempty"`
	// Destination, Port, Protocol, Shown and Why: a connection the name
	// check judged (connection): where it went, the name it showed (none:
	// it showed none), and why it was refused; Allowed says whether it was.
	Destination string `json:"destination,omitempty"`
	Port        uint16 `json:"port,omitempty"`
	Protocol    string `json:"protocol,omitempty"`
	Shown       string `json:"shown,omitempty"`
	Why         string `json:"why,omitempty"`
	// Decrypted: the connection was the secrets proxy's, which decrypted
	// it to put secrets into its requests (connection).
	Decrypted bool `json:"decrypted,omitempty"`
	// Host, Secret and Substituted: the secrets proxy put the secret
	// Secret (its name) into a request to Host, or refused one (Why)
	// (secret).
	Host        string `json:"host,omitempty"`
	Secret      string `json:"secret,omitempty"`
	Substituted bool   `json:"substituted,omitempty"`
	// Sent, Received and DurationMS: what an allowed connection moved
	// from the VM and to it (nil: not counted), and how long it ran
	// (connection_end).
	Sent       *uint64 `json:"sent,omitempty"`
	Received   *uint64 `json:"received,omitempty"`
	DurationMS uint64  `json:"duration_ms,omitempty"`
}

// Reachable is an address an answer let a VM reach, for Seconds.
type Reachable struct {
	Address string `json:"address"`
	Seconds uint32 `json:"seconds"`
}

// The kinds of events.
const (
	EventAttached      = "attached"
	EventDetached      = "detached"
	EventLease         = "lease"
	EventLearned       = "learned"
	EventCutOff        = "cut_off"
	EventPolicy        = "policy"
	EventForward       = "forward"
	EventAdopted       = "adopted"
	EventReclaimed     = "reclaimed"
	EventNetworkUp     = "network_up"
	EventNetworkDown   = "network_down"
	EventDropped       = "dropped"
	EventName          = "name"
	EventConnection    = "connection"
	EventConnectionEnd = "connection_end"
	EventSecret        = "secret"
)

// Events follows what happens, on a connection given over to it.
type Events struct {
	c *Client
}

// Follow subscribes to the events of network (all: "") and gives the
// connection over to them: c takes no other call afterwards, so use a
// Client of its own (Dial), not one that holds interfaces. recent: first
// the last events the daemon kept (up to 256), those of its start (the
// interfaces it adopted) among them. A reader that falls behind misses
// events and is told how many (EventDropped); it never holds the daemon up.
func (c *Client) Follow(ctx context.Context, network string, recent bool) (*Events, error) {
	body := struct {
		Op      string `json:"op"`
		Network string `json:"network,omitempty"`
		Recent  bool   `json:"recent,omitempty"`
	}{"events", network, recent}
	if _, err := c.call(ctx, body, "subscribed", nil); err != nil {
		return nil, err
	}
	return &Events{c: c}, nil
}

// Next waits for the next event, until ctx is done. An error from the
// connection (the daemon stopped) ends the stream.
func (e *Events) Next(ctx context.Context) (*Event, error) {
	c := e.c
	c.mu.Lock()
	defer c.mu.Unlock()
	deadline, _ := ctx.Deadline()
	if err := c.conn.SetDeadline(deadline); err != nil {
		return nil, err
	}
	defer c.endOnCancel(ctx)()
	body, fds, err := c.receive()
	closeAll(fds)
	if err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("linnet: %w", ctx.Err())
		}
		// The read's deadline is the context's, and may pass a moment
		// before the context says so.
		if _, ok := ctx.Deadline(); ok && isTimeout(err) {
			return nil, fmt.Errorf("linnet: %w", context.DeadlineExceeded)
		}
		return nil, fmt.Errorf("linnet: the events ended: %w", err)
	}
	var event struct {
		Reply string `json:"reply"`
		Event
	}
	if err := json.Unmarshal(body, &event); err != nil || event.Reply != "event" {
		return nil, fmt.Errorf("linnet: not an event: %s", body)
	}
	return &event.Event, nil
}

// Close ends the subscription and its connection.
func (e *Events) Close() error { return e.c.Close() }
