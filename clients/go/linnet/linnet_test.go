//go:build linux

package linnet

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"
)

// ctx is every call's context in the tests.
var ctx = context.Background()

// fakeDaemon is the other end of a SOCK_SEQPACKET pair: it reads a
// request and answers with the packets (and file descriptors) it is given.
type fakeDaemon struct {
	t    *testing.T
	conn *net.UnixConn
}

func pair(t *testing.T) (*Client, *fakeDaemon) {
	t.Helper()
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_SEQPACKET|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	conn := func(fd int) *net.UnixConn {
		f := os.NewFile(uintptr(fd), "seqpacket")
		defer f.Close()
		c, err := net.FileConn(f)
		if err != nil {
			t.Fatal(err)
		}
		return c.(*net.UnixConn)
	}
	client, daemon := NewClient(conn(fds[0])), &fakeDaemon{t, conn(fds[1])}
	t.Cleanup(func() { client.Close(); daemon.conn.Close() })
	return client, daemon
}

// serve answers one request: it checks the request's op, then sends each
// packet, the first with `fds`.
func (d *fakeDaemon) serve(op string, fds []int, packets ...string) <-chan map[string]interface{} {
	return d.serveAfterWith(op, 0, fds, packets...)
}

// serveAfter answers only after `delay`, as wait_address does.
func (d *fakeDaemon) serveAfter(op string, delay time.Duration, packets ...string) <-chan map[string]interface{} {
	return d.serveAfterWith(op, delay, nil, packets...)
}

func (d *fakeDaemon) serveAfterWith(op string, delay time.Duration, fds []int, packets ...string) <-chan map[string]interface{} {
	got := make(chan map[string]interface{}, 1)
	go func() {
		buf := make([]byte, maxPacket)
		n, err := d.conn.Read(buf)
		if err != nil {
			d.t.Errorf("fake daemon: %v", err)
			close(got)
			return
		}
		var req map[string]interface{}
		if err := json.Unmarshal(buf[:n], &req); err != nil || req["op"] != op {
			d.t.Errorf("fake daemon: expected op %q, got %s", op, buf[:n])
		}
		got <- req
		time.Sleep(delay)
		for i, p := range packets {
			var oob []byte
			if i == 0 && len(fds) > 0 {
				oob = syscall.UnixRights(fds...)
			}
			if _, _, err := d.conn.WriteMsgUnix([]byte(p), oob, nil); err != nil {
				d.t.Errorf("fake daemon: %v", err)
			}
		}
	}()
	return got
}

func TestAttachReturnsTheInterfaceAndItsFileDescriptor(t *testing.T) {
	client, daemon := pair(t)
	r, w := pipe(t)
	reply := `{"reply":"attached","interface":{"interface_id":"6b1c6b70-1111-4c4c-9c9c-000000000001",
		"network":"shared","mode":"shared","datapath":"tap","name":"web","mac_address":"52:54:00:12:34:56",
		"ip_address":"192.168.105.2","gateway":"192.168.105.1","subnet":"192.168.105.0/24",
		"dns":["192.168.105.1"],"domain":"shared.linnet","tap":"lnt7","mtu":1500,"forwards":["8080:80/tcp"],
		"vmnet_mac_address":"52:54:00:12:34:56"},"reclaim_token":"0f1e2d"}`
	got := daemon.serve("attach", []int{int(r.Fd())}, reply)
	iface, tap, err := client.Attach(ctx, AttachRequest{Network: "shared", Name: "web", Publish: []string{"8080:80/tcp"}})
	if err != nil {
		t.Fatal(err)
	}
	defer tap.Close()
	req := <-got
	if req["network"] != "shared" || req["name"] != "web" || req["mac"] != nil {
		t.Errorf("the request: %v", req)
	}
	if iface.IPAddress != "192.168.105.2" || iface.TAP != "lnt7" || iface.MTU != 1500 ||
		len(iface.Forwards) != 1 || !strings.Contains(string(iface.Raw), "vmnet_mac_address") ||
		iface.ReclaimToken != "0f1e2d" {
		t.Errorf("the interface: %+v", iface)
	}
	// The file is the descriptor the daemon sent: what goes in comes out.
	if _, err := w.Write([]byte("frame")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 5)
	if _, err := io.ReadFull(tap, buf); err != nil || string(buf) != "frame" {
		t.Errorf("read %q, %v from the received descriptor", buf, err)
	}
	flags, _, errno := syscall.Syscall(syscall.SYS_FCNTL, tap.Fd(), syscall.F_GETFD, 0)
	if errno != 0 || flags&syscall.FD_CLOEXEC == 0 {
		t.Errorf("the received descriptor is not close-on-exec")
	}
}

func TestReclaimSendsTheTokenAndTakesTheReply(t *testing.T) {
	client, daemon := pair(t)
	got := daemon.serve("reclaim", nil, `{"reply":"reclaimed","interface_id":"x"}`)
	if err := client.Reclaim(ctx, "x", "0f1e2d"); err != nil {
		t.Fatal(err)
	}
	if req := <-got; req["interface_id"] != "x" || req["token"] != "0f1e2d" {
		t.Errorf("the request: %v", req)
	}
	daemon.serve("reclaim", nil, `{"reply":"error","kind":"bad_request","message":"interface x is not attached"}`)
	var e *Error
	if err := client.Reclaim(ctx, "x", "0f1e2d"); !errors.As(err, &e) || e.Kind != "bad_request" {
		t.Fatalf("got %v", err)
	}
}

func TestAnErrorReplyIsAnError(t *testing.T) {
	client, daemon := pair(t)
	daemon.serve("attach", nil, `{"reply":"error","kind":"unknown_network","message":"unknown network \"lab\""}`)
	_, _, err := client.Attach(ctx, AttachRequest{Network: "lab"})
	var e *Error
	if !errors.As(err, &e) || e.Kind != KindUnknownNetwork || !strings.Contains(e.Error(), `"lab"`) {
		t.Fatalf("got %v", err)
	}
}

func TestAnAttachWithoutADescriptorIsRefusedAndUndone(t *testing.T) {
	client, daemon := pair(t)
	detached := make(chan interface{}, 1)
	go func() {
		<-daemon.serve("attach", nil, `{"reply":"attached","interface":{"interface_id":"x"}}`)
		detached <- (<-daemon.serve("detach", nil, `{"reply":"detached","interface_id":"x"}`))["interface_id"]
	}()
	if _, _, err := client.Attach(ctx, AttachRequest{}); err == nil || !strings.Contains(err.Error(), "0 file descriptors") {
		t.Fatalf("got %v", err)
	}
	if id := <-detached; id != "x" {
		t.Errorf("the unusable interface was not detached: %v", id)
	}
}

func TestALargeReplyComesInPieces(t *testing.T) {
	client, daemon := pair(t)
	var interfaces []string
	for i := 0; i < 2000; i++ {
		interfaces = append(interfaces, `{"interface_id":"id","network":"scale","tap":"lnt1","datapath":"tap"}`)
	}
	body := `{"reply":"listing","networks":[],"interfaces":[` + strings.Join(interfaces, ",") + `]}`
	packets := []string{`{"large_message":` + itoa(len(body)) + `}`}
	for rest := body; rest != ""; {
		n := len(rest)
		if n > maxPacket {
			n = maxPacket
		}
		packets = append(packets, rest[:n])
		rest = rest[n:]
	}
	if len(packets) < 3 {
		t.Fatalf("the reply should need several packets, has %d", len(packets))
	}
	daemon.serve("list", nil, packets...)
	l, err := client.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(l.Interfaces) != 2000 || l.Interfaces[1999].Network != "scale" {
		t.Errorf("listed %d interfaces", len(l.Interfaces))
	}
}

func TestAnOversizedReplyIsDroppedAndTheConnectionGoesOn(t *testing.T) {
	client, daemon := pair(t)
	defer func(was int) { maxLargeReply = was }(maxLargeReply)
	maxLargeReply = 1000
	body := `{"reply":"listing","networks":[],"interfaces":[]}` + strings.Repeat(" ", 2000)
	daemon.serve("list", nil, `{"large_message":`+itoa(len(body))+`}`, body[:1500], body[1500:])
	if _, err := client.List(ctx); err == nil || !strings.Contains(err.Error(), "more than 1000; dropped") {
		t.Fatalf("got %v", err)
	}
	daemon.serve("detach", nil, `{"reply":"detached","interface_id":"x"}`)
	if err := client.Detach(ctx, "x"); err != nil {
		t.Fatalf("the next call: %v", err)
	}
}

func TestATimedOutCallsReplyIsTakenByTheNext(t *testing.T) {
	client, daemon := pair(t)
	client.Timeout = 50 * time.Millisecond
	go func() {
		buf := make([]byte, maxPacket)
		// The first call's reply comes after the call gave up on it.
		daemon.conn.Read(buf)
		time.Sleep(200 * time.Millisecond)
		daemon.conn.Write([]byte(`{"reply":"detached","interface_id":"first"}`))
		daemon.conn.Read(buf)
		daemon.conn.Write([]byte(`{"reply":"error","kind":"bad_request","message":"second"}`))
	}()
	if err := client.Detach(ctx, "first"); err == nil || !strings.Contains(err.Error(), "no reply within") {
		t.Fatalf("the first call: %v", err)
	}
	client.Timeout = 5 * time.Second
	var e *Error
	if err := client.Detach(ctx, "second"); !errors.As(err, &e) || e.Message != "second" {
		t.Fatalf("the second call got %v, not its own reply", err)
	}
}

func TestACancelledCallEndsAtOnceAndItsReplyIsTakenByTheNext(t *testing.T) {
	client, daemon := pair(t)
	go func() {
		buf := make([]byte, maxPacket)
		daemon.conn.Read(buf)
		time.Sleep(300 * time.Millisecond)
		daemon.conn.Write([]byte(`{"reply":"detached","interface_id":"first"}`))
		daemon.conn.Read(buf)
		daemon.conn.Write([]byte(`{"reply":"error","kind":"bad_request","message":"second"}`))
	}()
	cancelled, cancel := context.WithCancel(context.Background())
	time.AfterFunc(50*time.Millisecond, cancel)
	start := time.Now()
	err := client.Detach(cancelled, "first")
	if !errors.Is(err, context.Canceled) || time.Since(start) > 250*time.Millisecond {
		t.Fatalf("the cancelled call: %v after %v", err, time.Since(start))
	}
	if err := client.Detach(cancelled, "again"); !errors.Is(err, context.Canceled) {
		t.Fatalf("a call on a cancelled context: %v", err)
	}
	var e *Error
	if err := client.Detach(ctx, "second"); !errors.As(err, &e) || e.Message != "second" {
		t.Fatalf("the next call got %v, not its own reply", err)
	}
}

func TestABusyRefusalIsReadAfterAFailedWrite(t *testing.T) {
	client, daemon := pair(t)
	// As the daemon does for a user over its connection limit: why, then close.
	daemon.conn.Write([]byte(`{"reply":"error","kind":"busy","message":"uid 1000 has 256 connections"}`))
	daemon.conn.Close()
	var e *Error
	if _, err := client.List(ctx); !errors.As(err, &e) || e.Kind != KindBusy {
		t.Fatalf("got %v", err)
	}
}

func TestAPacketCutShortBreaksTheConnection(t *testing.T) {
	client, daemon := pair(t)
	body := `{"reply":"listing","networks":[],"interfaces":[]}`
	daemon.serve("list", nil, `{"large_message":`+itoa(len(body)+10)+`}`, body)
	go func() { time.Sleep(100 * time.Millisecond); daemon.conn.Close() }()
	if _, err := client.List(ctx); err == nil {
		t.Fatal("no error")
	}
	if _, err := client.List(ctx); err == nil || !strings.Contains(err.Error(), "out of step") {
		t.Fatalf("the next call: %v", err)
	}
}

func TestADaemonThatHangsUpIsAnError(t *testing.T) {
	client, daemon := pair(t)
	go func() {
		buf := make([]byte, maxPacket)
		daemon.conn.Read(buf)
		daemon.conn.Close()
	}()
	if err := client.Detach(ctx, "x"); err == nil {
		t.Fatal("no error")
	}
}

func TestForwardRequestsNameTheirFields(t *testing.T) {
	client, daemon := pair(t)
	got := daemon.serve("forward_add", nil, `{"reply":"ok"}`)
	if err := client.ForwardAdd(ctx, ForwardRef{Network: "shared", Name: "web", Forward: "9090:80/tcp"}); err != nil {
		t.Fatal(err)
	}
	req := <-got
	if req["network"] != "shared" || req["name"] != "web" || req["forward"] != "9090:80/tcp" || req["interface_id"] != nil {
		t.Errorf("the request: %v", req)
	}
	daemon.serve("forward_list", nil, `{"reply":"forwards","forwards":[{"network":"shared","interface_id":"x",
		"name":"web","forward":"9090:80/tcp","guest":"192.168.105.2:80","origin":"runtime"}]}`)
	forwards, err := client.ForwardList(ctx)
	if err != nil || len(forwards) != 1 || forwards[0].Guest != "192.168.105.2:80" || forwards[0].Origin != "runtime" {
		t.Fatalf("got %+v, %v", forwards, err)
	}
}

func TestSecretsAreSetRemovedAndListedWithoutValues(t *testing.T) {
	client, daemon := pair(t)
	got := daemon.serve("secret_set", nil, `{"reply":"ok"}`)
	if err := client.SecretSet(ctx, "TOKEN", "s3cret", "shared"); err != nil {
		t.Fatal(err)
	}
	req := <-got
	if req["name"] != "TOKEN" || req["value"] != "s3cret" || req["network"] != "shared" {
		t.Errorf("the request: %v", req)
	}
	got = daemon.serve("secret_remove", nil, `{"reply":"ok"}`)
	if err := client.SecretRemove(ctx, "TOKEN", ""); err != nil {
		t.Fatal(err)
	}
	if req := <-got; req["name"] != "TOKEN" || req["network"] != nil || req["value"] != nil {
		t.Errorf("the request: %v", req)
	}
	daemon.serve("secret_list", nil, `{"reply":"secrets","secrets":[
		{"owner":{"uid":1000},"name":"GITHUB_TOKEN","set_at_ms":17},
		{"owner":{"network":"shared"},"name":"NPM_TOKEN","set_at_ms":18}]}`)
	secrets, err := client.SecretList(ctx)
	if err != nil || len(secrets) != 2 || secrets[0].Owner.UID == nil || *secrets[0].Owner.UID != 1000 ||
		secrets[1].Owner.Network != "shared" || secrets[1].Owner.UID != nil || secrets[1].SetAtMs != 18 {
		t.Fatalf("got %+v, %v", secrets, err)
	}
	got = daemon.serve("ca", nil, `{"reply":"ca","network":"shared","certificate":"-----BEGIN CERTIFICATE-----\nx\n"}`)
	if pem, err := client.CA(ctx, "shared"); err != nil || pem != "-----BEGIN CERTIFICATE-----\nx\n" {
		t.Fatalf("got %q, %v", pem, err)
	}
	if req := <-got; req["network"] != "shared" {
		t.Errorf("the request: %v", req)
	}
	// A policy's secret rules go and come as the API has them.
	got = daemon.serve("policy_set", nil, `{"reply":"policy","interface_id":"x",
		"policy":{"egress":["api.example.com:443/tcp"],"secrets":["TOKEN@api.example.com"],
		"network_secrets":["NET@api.example.com"]}}`)
	info, err := client.PolicySet(ctx, InterfaceRef{Network: "shared", Name: "agent"},
		Policy{Egress: []string{"api.example.com:443/tcp"}, Secrets: []string{"TOKEN@api.example.com"}})
	if err != nil || info.Policy.Secrets[0] != "TOKEN@api.example.com" || info.Policy.NetworkSecrets[0] != "NET@api.example.com" {
		t.Fatalf("got %+v, %v", info, err)
	}
	policy, _ := (<-got)["policy"].(map[string]interface{})
	if policy["secrets"].([]interface{})[0] != "TOKEN@api.example.com" || policy["network_secrets"] != nil {
		t.Errorf("the policy sent: %v", policy)
	}
}

func TestPoliciesByNameAreSetShownAndListed(t *testing.T) {
	client, daemon := pair(t)
	got := daemon.serve("policy_set", nil, `{"reply":"policy","interface_id":"x",
		"policy":{"egress":["api.example.com:443/tcp"]},
		"learned":[{"name":"api.example.com","address":"192.0.2.7","expires_in":59}]}`)
	info, err := client.PolicySet(ctx, InterfaceRef{Network: "shared", Name: "agent"},
		Policy{Egress: []string{"api.example.com:443/tcp"}})
	if err != nil || info.Policy.Egress[0] != "api.example.com:443/tcp" ||
		len(info.Learned) != 1 || info.Learned[0].Address != "192.0.2.7" || info.Learned[0].ExpiresIn != 59 {
		t.Fatalf("got %+v, %v", info, err)
	}
	req := <-got
	policy, _ := req["policy"].(map[string]interface{})
	if req["network"] != "shared" || req["name"] != "agent" || req["interface_id"] != nil ||
		policy["egress"].([]interface{})[0] != "api.example.com:443/tcp" || policy["ingress"] != nil {
		t.Errorf("the request: %v", req)
	}
	daemon.serve("policy_show", nil, `{"reply":"policy","interface_id":"x","policy":{}}`)
	if info, err := client.PolicyShow(ctx, InterfaceRef{Network: "shared", InterfaceID: "x"}); err != nil ||
		len(info.Policy.Egress) != 0 || info.Learned != nil || info.Enforced != nil {
		t.Fatalf("got %+v, %v", info, err)
	}
	daemon.serve("policy_show", nil, `{"reply":"policy","interface_id":"x","policy":{},
		"enforced":{"policy":true,"rate_limit":false,"by":"/etc/linnet/networks.yaml"}}`)
	if info, err := client.PolicyShow(ctx, InterfaceRef{Network: "shared", InterfaceID: "x"}); err != nil ||
		info.Enforced == nil || !info.Enforced.Policy || info.Enforced.RateLimit ||
		info.Enforced.By != "/etc/linnet/networks.yaml" {
		t.Fatalf("got %+v, %v", info, err)
	}
	daemon.serve("list", nil, `{"reply":"listing","networks":[],"interfaces":[{"interface_id":"x",
		"network":"shared","mac_address":"02:00:00:00:00:01","tap":"lnt0","forwards":[],"client_pid":1,
		"client_uid":0,"datapath":"tap","vm_rx_bytes":0,"vm_tx_bytes":0,
		"policy":{"egress":["api.example.com:443/tcp"]},"refused_queries":4,"refused_connections":2}]}`)
	l, err := client.List(ctx)
	if err != nil || *l.Interfaces[0].RefusedQueries != 4 || *l.Interfaces[0].RefusedConnections != 2 ||
		l.Interfaces[0].Policy.Egress[0] != "api.example.com:443/tcp" {
		t.Fatalf("got %+v, %v", l, err)
	}
}

func TestRateLimitsAreSetAloneAndShown(t *testing.T) {
	client, daemon := pair(t)
	got := daemon.serve("policy_set", nil, `{"reply":"policy","interface_id":"x",
		"policy":{"egress":["10.0.0.0/8"],"rate_limit":{"in":"100mbit","out":"10mbit"}}}`)
	info, err := client.PolicySetPart(ctx, InterfaceRef{Network: "shared", Name: "vm"},
		Policy{RateLimit: &RateLimit{In: "100mbit", Out: "10mbit"}}, PartRateLimit)
	if err != nil || info.Policy.RateLimit == nil || info.Policy.RateLimit.Out != "10mbit" ||
		info.Policy.Egress[0] != "10.0.0.0/8" {
		t.Fatalf("got %+v, %v", info, err)
	}
	req := <-got
	policy, _ := req["policy"].(map[string]interface{})
	rate, _ := policy["rate_limit"].(map[string]interface{})
	if req["only"] != "rate_limit" || rate["in"] != "100mbit" || rate["out"] != "10mbit" || policy["egress"] != nil {
		t.Errorf("the request: %v", req)
	}
	got = daemon.serve("policy_set", nil, `{"reply":"policy","interface_id":"x","policy":{}}`)
	if _, err := client.PolicySet(ctx, InterfaceRef{Network: "shared", Name: "vm"}, Policy{}); err != nil {
		t.Fatal(err)
	}
	if req := <-got; req["only"] != nil {
		t.Errorf("a whole policy names no part: %v", req)
	}
}

func TestEventsFollowUntilTheContextEnds(t *testing.T) {
	client, daemon := pair(t)
	got := daemon.serve("events", nil, `{"reply":"subscribed"}`,
		`{"reply":"event","time_ms":5,"network":"shared","event":"attached","interface_id":"x","name":"vm",
		  "mac_address":"02:00:00:00:00:01","ip_address":"192.168.105.2","tap":"lnt0","datapath":"tap","uid":1000}`,
		`{"reply":"event","time_ms":6,"event":"dropped","count":12}`,
		`{"reply":"event","time_ms":7,"network":"shared","event":"name","interface_id":"x","name":"vm",
		  "asked":"api.example.com","allowed":true,"learned":[{"address":"192.0.2.7","seconds":60}],"held_back":3}`,
		`{"reply":"event","time_ms":8,"network":"shared","event":"connection","interface_id":"x","name":"vm",
		  "destination":"192.0.2.7","port":443,"protocol":"tcp","shown":"other.example","allowed":false,
		  "why":"the name it showed is not allowed on this port"}`,
		`{"reply":"event","time_ms":9,"network":"shared","event":"connection_end","interface_id":"x","name":"vm",
		  "destination":"192.0.2.7","port":443,"protocol":"tcp","shown":"api.example.com",
		  "sent":2810,"received":318204,"duration_ms":412}`)
	events, err := client.Follow(ctx, "shared", true)
	if err != nil {
		t.Fatal(err)
	}
	if req := <-got; req["network"] != "shared" || req["recent"] != true {
		t.Errorf("the request: %v", req)
	}
	e, err := events.Next(ctx)
	if err != nil || e.Event != EventAttached || e.Name != "vm" || e.IPAddress != "192.168.105.2" || *e.UID != 1000 {
		t.Fatalf("got %+v, %v", e, err)
	}
	e, err = events.Next(ctx)
	if err != nil || e.Event != EventDropped || e.Count != 12 || e.Network != "" {
		t.Fatalf("got %+v, %v", e, err)
	}
	e, err = events.Next(ctx)
	if err != nil || e.Event != EventName || e.Asked != "api.example.com" || !e.Allowed ||
		len(e.Learned) != 1 || e.Learned[0].Address != "192.0.2.7" || e.Learned[0].Seconds != 60 || e.HeldBack != 3 {
		t.Fatalf("got %+v, %v", e, err)
	}
	e, err = events.Next(ctx)
	if err != nil || e.Event != EventConnection || e.Destination != "192.0.2.7" || e.Port != 443 ||
		e.Protocol != "tcp" || e.Shown != "other.example" || e.Allowed || e.Why == "" {
		t.Fatalf("got %+v, %v", e, err)
	}
	e, err = events.Next(ctx)
	if err != nil || e.Event != EventConnectionEnd || e.Shown != "api.example.com" ||
		e.Sent == nil || *e.Sent != 2810 || *e.Received != 318204 || e.DurationMS != 412 {
		t.Fatalf("got %+v, %v", e, err)
	}
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if _, err := events.Next(short); err == nil || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("no event: %v", err)
	}
}

func itoa(n int) string {
	b, _ := json.Marshal(n)
	return string(b)
}

func TestWaitAddressAsksTheDaemonAndWaitsBeyondTheCallTimeout(t *testing.T) {
	client, daemon := pair(t)
	client.Timeout = 50 * time.Millisecond
	got := daemon.serveAfter("wait_address", 200*time.Millisecond,
		`{"reply":"address","interface_id":"x","ip_address":"10.77.0.117"}`)
	ip, err := client.WaitAddress(ctx, "lan", "x", time.Second)
	if err != nil || ip != "10.77.0.117" {
		t.Fatalf("got %q, %v", ip, err)
	}
	req := <-got
	if req["network"] != "lan" || req["interface_id"] != "x" || req["timeout_ms"] != float64(1000) {
		t.Errorf("the request: %v", req)
	}
}

func TestACloneIsAskedForByNameOrByItsRecordedGuest(t *testing.T) {
	client, daemon := pair(t)
	r, _ := pipe(t)
	reply := `{"reply":"attached","interface":{"interface_id":"x","network":"shared","mode":"shared",
		"datapath":"tap","mac_address":"52:54:00:12:34:56","ip_address":"192.168.105.2",
		"clone_address":"198.18.105.1","dns":[],"domain":"shared.linnet","tap":"tap0","mtu":1500,"forwards":[]}}`
	for _, of := range []any{"web", &CloneGuest{MACAddress: "52:54:00:12:34:56", IPAddress: "192.168.105.2"}} {
		got := daemon.serve("attach", []int{int(r.Fd())}, reply)
		iface, tap, err := client.Attach(ctx, AttachRequest{CloneOf: of})
		if err != nil {
			t.Fatal(err)
		}
		tap.Close()
		req := <-got
		if iface.CloneAddress != "198.18.105.1" || iface.IPAddress != "192.168.105.2" {
			t.Errorf("the clone: %+v", iface)
		}
		switch want := of.(type) {
		case string:
			if req["clone_of"] != want {
				t.Errorf("the request: %v", req)
			}
		case *CloneGuest:
			guest, _ := req["clone_of"].(map[string]any)
			if guest["mac_address"] != want.MACAddress || guest["ip_address"] != want.IPAddress || guest["tap"] != nil {
				t.Errorf("the request: %v", req)
			}
		}
	}
}

// pipe is a pipe closed when the test ends: a descriptor for the fake
// daemon to send.
func pipe(t *testing.T) (*os.File, *os.File) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close(); w.Close() })
	return r, w
}
