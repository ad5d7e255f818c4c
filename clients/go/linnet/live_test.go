//go:build linux

package linnet

import (
	"errors"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"
)

// TestLive runs against a live daemon: the integration suite
// (tests/integration/clients.rs) starts one in its namespaces and runs
// `go test -run TestLive` with LINNET_TEST_SOCKET set to its socket, and
// fails if this test did not run and pass. Without that variable there is
// no daemon to talk to. LINNET_TEST_STANDIN, LINNET_TEST_NETNS and
// LINNET_TEST_UDHCPC_SCRIPT name the suite's stand-in VM, a namespace for
// it and the udhcpc script that prints the lease: a VMM driving the TAP
// this package received. LINNET_TEST_NETWORK_SOCKET is the socket the
// listing must give for `shared`.
func TestLive(t *testing.T) {
	path := os.Getenv("LINNET_TEST_SOCKET")
	if path == "" {
		t.Skip("LINNET_TEST_SOCKET is not set: the integration suite runs this against a live daemon")
	}
	client, err := Dial(path)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()

	iface, tap, err := client.Attach(ctx, AttachRequest{Network: "shared", Name: "gotest", Publish: []string{"18080:80/tcp"}})
	if err != nil {
		t.Fatal(err)
	}
	if iface.IPAddress == "" || iface.Gateway == "" || iface.MACAddress == "" || iface.Datapath != "tap" {
		t.Errorf("attached: %+v", iface)
	}
	// The file is that interface's TAP.
	if name := tapName(t, tap); name != iface.TAP {
		t.Errorf("the descriptor is TAP %q, the reply says %q", name, iface.TAP)
	}
	tap.Close() // a VMM would hold it; the interface lives on the connection

	if want := os.Getenv("LINNET_TEST_NETWORK_SOCKET"); want != "" {
		l, err := client.List(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range l.Networks {
			if n.Name == "shared" && n.Socket != want {
				t.Errorf("shared's socket is %q, not %q", n.Socket, want)
			}
		}
	}

	listed := find(t, client, iface.InterfaceID)
	if listed == nil || listed.IPAddress != iface.IPAddress || listed.Name != "gotest" || listed.ClientPID != os.Getpid() {
		t.Fatalf("listed: %+v", listed)
	}

	// Another connection cannot take the interface: not with a wrong
	// token, nor with the right one while this connection holds it.
	other, err := Dial(path)
	if err != nil {
		t.Fatal(err)
	}
	var e *Error
	if iface.ReclaimToken == "" {
		t.Errorf("no reclaim token in the attach reply")
	}
	if err := other.Reclaim(ctx, iface.InterfaceID, "wrong"); !errors.As(err, &e) || e.Kind != "not_allowed" {
		t.Errorf("a wrong token: %v", err)
	}
	if err := other.Reclaim(ctx, iface.InterfaceID, iface.ReclaimToken); !errors.As(err, &e) || e.Kind != KindBusy {
		t.Errorf("re-claiming a held interface: %v", err)
	}
	other.Close()

	ref := ForwardRef{Network: "shared", Name: "gotest", Forward: "18081:81/tcp"}
	if err := client.ForwardAdd(ctx, ref); err != nil {
		t.Fatal(err)
	}
	forwards, err := client.ForwardList(ctx)
	if err != nil {
		t.Fatal(err)
	}
	origins := map[string]string{}
	for _, f := range forwards {
		if f.InterfaceID == iface.InterfaceID {
			origins[f.Forward] = f.Origin
		}
	}
	if origins["18080:80/tcp"] != "publish" || origins["18081:81/tcp"] != "runtime" {
		t.Errorf("forwards of the interface: %v", origins)
	}
	if err := client.ForwardRemove(ctx, ref); err != nil {
		t.Fatal(err)
	}
	if err := client.ForwardRemove(ctx, ref); !errors.As(err, &e) || e.Kind != "bad_request" {
		t.Errorf("removing it twice: %v", err)
	}

	// A policy by name: set, shown, listed, and a bad name refused.
	pref := InterfaceRef{Network: "shared", Name: "gotest"}
	info, err := client.PolicySet(ctx, pref, Policy{Egress: []string{"API.example.com:443/tcp", "10.0.0.0/8"}})
	if err != nil || len(info.Policy.Egress) != 2 || info.Policy.Egress[0] != "api.example.com:443/tcp" {
		t.Fatalf("setting a policy by name: %+v, %v", info, err)
	}
	if info, err := client.PolicyShow(ctx, pref); err != nil || info.InterfaceID != iface.InterfaceID || len(info.Learned) != 0 {
		t.Errorf("showing it: %+v, %v", info, err)
	}
	if l := find(t, client, iface.InterfaceID); l == nil || l.RefusedQueries == nil || *l.RefusedQueries != 0 ||
		l.RefusedConnections == nil {
		t.Errorf("listed with a policy by name: %+v", l)
	}
	if _, err := client.PolicySet(ctx, pref, Policy{Egress: []string{"www.*.example.com"}}); !errors.As(err, &e) ||
		!strings.Contains(e.Message, "a wildcard is a whole first label") {
		t.Errorf("a bad name: %v", err)
	}
	if _, err := client.PolicySet(ctx, pref, Policy{}); err != nil {
		t.Fatal(err)
	}

	if _, _, err := client.Attach(ctx, AttachRequest{Network: "nosuch"}); !errors.As(err, &e) || e.Kind != KindUnknownNetwork ||
		!strings.Contains(e.Message, "nosuch") {
		t.Errorf("an unknown network: %v", err)
	}

	if err := client.Detach(ctx, iface.InterfaceID); err != nil {
		t.Fatal(err)
	}
	if find(t, client, iface.InterfaceID) != nil {
		t.Error("still listed after detach")
	}

	driveWithStandin(t, client)

	// The connection is the lifeline: closing it detaches what it holds.
	second, tap2, err := client.Attach(ctx, AttachRequest{Network: "shared"})
	if err != nil {
		t.Fatal(err)
	}
	tap2.Close()
	client.Close()
	observer, err := Dial(path)
	if err != nil {
		t.Fatal(err)
	}
	defer observer.Close()
	deadline := time.Now().Add(10 * time.Second)
	for find(t, observer, second.InterfaceID) != nil {
		if time.Now().After(deadline) {
			t.Fatal("the interface outlived its connection by 10 s")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// driveWithStandin attaches an interface, hands its TAP to the suite's
// stand-in VM as a VMM would (fd 3), checks that the guest leases the
// address Attach reported, and that Detach takes the TAP away from it.
func driveWithStandin(t *testing.T, client *Client) {
	t.Helper()
	standin, netns, script := os.Getenv("LINNET_TEST_STANDIN"), os.Getenv("LINNET_TEST_NETNS"), os.Getenv("LINNET_TEST_UDHCPC_SCRIPT")
	if standin == "" || netns == "" || script == "" {
		t.Fatal("LINNET_TEST_STANDIN, LINNET_TEST_NETNS and LINNET_TEST_UDHCPC_SCRIPT must be set with LINNET_TEST_SOCKET")
	}
	iface, tap, err := client.Attach(ctx, AttachRequest{Network: "shared"})
	if err != nil {
		t.Fatal(err)
	}
	vmm := exec.Command(standin, "--fd", "3", "--netns", "/run/netns/"+netns, "--mac", iface.MACAddress)
	vmm.ExtraFiles = []*os.File{tap}
	vmm.Stderr = os.Stderr
	if err := vmm.Start(); err != nil {
		t.Fatal(err)
	}
	tap.Close() // the VMM holds it now
	exited := make(chan error, 1)
	go func() { exited <- vmm.Wait() }()
	reaped := false
	defer func() {
		if !reaped {
			_ = vmm.Process.Kill()
			<-exited
		}
	}()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if exec.Command("ip", "netns", "exec", netns, "ip", "link", "show", "eth0").Run() == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the stand-in made no eth0 in 10 s")
		}
	}
	out, err := exec.Command("ip", "netns", "exec", netns, "busybox", "udhcpc", "-i", "eth0", "-n", "-q", "-f",
		"-t", "5", "-T", "1", "-s", script).CombinedOutput()
	if err != nil {
		t.Fatalf("udhcpc: %v: %s", err, out)
	}
	if want := "linnet-guest: lease ip=" + iface.IPAddress + " "; !strings.Contains(string(out), want) {
		t.Errorf("the guest did not lease %s, the address Attach reported:\n%s", iface.IPAddress, out)
	}
	if err := client.Detach(ctx, iface.InterfaceID); err != nil {
		t.Fatal(err)
	}
	if find(t, client, iface.InterfaceID) != nil {
		t.Error("still listed after detach")
	}
	// The TAP is gone under the VMM: its next read fails and it exits.
	select {
	case <-exited:
		reaped = true
	case <-time.After(10 * time.Second):
		t.Error("the stand-in still runs 10 s after its interface was detached")
	}
}

func find(t *testing.T, c *Client, id string) *Listed {
	t.Helper()
	l, err := c.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for i := range l.Interfaces {
		if l.Interfaces[i].InterfaceID == id {
			return &l.Interfaces[i]
		}
	}
	return nil
}

// tapName asks the kernel which TAP a descriptor is (TUNGETIFF).
func tapName(t *testing.T, f *os.File) string {
	t.Helper()
	const tunGetIff = 0x800454d2 // _IOR('T', 210, unsigned int) on x86 and arm; ppc64 and mips differ
	var ifr [40]byte
	if _, _, errno := syscall.Syscall(syscall.SYS_IOCTL, f.Fd(), tunGetIff, uintptr(unsafe.Pointer(&ifr[0]))); errno != 0 {
		t.Fatalf("TUNGETIFF: %v", errno)
	}
	return strings.TrimRight(string(ifr[:16]), "\x00")
}
