//go:build linux

package linnet

import (
	"errors"
	"os"
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
// no daemon to talk to.
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

	iface, tap, err := client.Attach(AttachRequest{Network: "shared", Name: "gotest", Publish: []string{"18080:80/tcp"}})
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

	listed := find(t, client, iface.InterfaceID)
	if listed == nil || listed.IPAddress != iface.IPAddress || listed.Name != "gotest" || listed.ClientPID != os.Getpid() {
		t.Fatalf("listed: %+v", listed)
	}

	ref := ForwardRef{Network: "shared", Name: "gotest", Forward: "18081:81/tcp"}
	if err := client.ForwardAdd(ref); err != nil {
		t.Fatal(err)
	}
	forwards, err := client.ForwardList()
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
	if err := client.ForwardRemove(ref); err != nil {
		t.Fatal(err)
	}
	var e *Error
	if err := client.ForwardRemove(ref); !errors.As(err, &e) || e.Kind != "bad_request" {
		t.Errorf("removing it twice: %v", err)
	}

	if _, _, err := client.Attach(AttachRequest{Network: "nosuch"}); !errors.As(err, &e) || e.Kind != "unknown_network" ||
		!strings.Contains(e.Message, "nosuch") {
		t.Errorf("an unknown network: %v", err)
	}

	if err := client.Detach(iface.InterfaceID); err != nil {
		t.Fatal(err)
	}
	if find(t, client, iface.InterfaceID) != nil {
		t.Error("still listed after detach")
	}

	// The connection is the lifeline: closing it detaches what it holds.
	second, tap2, err := client.Attach(AttachRequest{Network: "shared"})
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

func find(t *testing.T, c *Client, id string) *Listed {
	t.Helper()
	l, err := c.List()
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
