//! linnet-standin: plays the VMM in tests and benchmarks.
//!
//! It takes the datapath a VMM would get from linnet (for now a TAP fd, as
//! `linnet run` hands to QEMU), creates a TAP inside a guest network
//! namespace, and moves frames between the two, one thread per direction.
//! The guest namespace's kernel then acts as the VM: real DHCP clients,
//! ping, iperf3. Both TAPs carry a virtio-net header and accept offloads, as
//! a virtio-net VMM's would, so large TCP segments cross without splitting.

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::OpenOptionsExt;
use std::process::exit;
use std::sync::Arc;

const TUNSETIFF: libc::c_ulong = 0x4004_54ca;
const TUNSETOFFLOAD: libc::c_ulong = 0x4004_54d0;
const IFF_TAP: libc::c_short = 0x0002;
const IFF_NO_PI: libc::c_short = 0x1000;
const IFF_VNET_HDR: libc::c_short = 0x4000;
const TUN_F_CSUM: libc::c_ulong = 0x01;
const TUN_F_TSO4: libc::c_ulong = 0x02;
const TUN_F_TSO6: libc::c_ulong = 0x04;
/// A GSO frame of up to 64 KiB plus its virtio-net header.
const BUFFER: usize = 65536 + 64;

const USAGE: &str =
    "usage: linnet-standin --fd N --netns PATH [--ifname eth0] [--mac MAC] [--mtu N]
  --fd N        the TAP fd from linnet (e.g. {fd} under `linnet run`)
  --netns PATH  the guest network namespace (e.g. /run/netns/guest1)
  --ifname      the guest's interface name (default eth0)
  --mac         the guest's MAC (default: $LINNET_MAC)
  --mtu         the guest's MTU (default 1500)";

struct Options {
    fd: RawFd,
    netns: String,
    ifname: String,
    mac: Option<[u8; 6]>,
    mtu: u32,
}

fn main() {
    let opts = parse_args().unwrap_or_else(|e| {
        eprintln!("linnet-standin: {e}\n{USAGE}");
        exit(2)
    });
    if let Err(e) = run(opts) {
        eprintln!("linnet-standin: {e}");
        exit(1);
    }
}

fn parse_args() -> Result<Options, String> {
    let mut args = std::env::args().skip(1);
    let mut fd = None;
    let mut netns = None;
    let mut ifname = "eth0".to_string();
    let mut mac = std::env::var("LINNET_MAC").ok();
    let mut mtu = 1500;
    while let Some(arg) = args.next() {
        let mut value = || args.next().ok_or(format!("{arg} needs a value"));
        match arg.as_str() {
            "--fd" => {
                fd = Some(
                    value()?
                        .parse::<RawFd>()
                        .map_err(|e| format!("--fd: {e}"))?,
                )
            }
            "--netns" => netns = Some(value()?),
            "--ifname" => ifname = value()?,
            "--mac" => mac = Some(value()?),
            "--mtu" => mtu = value()?.parse().map_err(|e| format!("--mtu: {e}"))?,
            "-h" | "--help" => {
                println!("{USAGE}");
                exit(0)
            }
            other => return Err(format!("unknown argument {other}")),
        }
    }
    let mac = match mac {
        None => None,
        Some(m) => Some(parse_mac(&m).ok_or(format!("bad MAC {m}"))?),
    };
    Ok(Options {
        fd: fd.ok_or("--fd is required")?,
        netns: netns.ok_or("--netns is required")?,
        ifname,
        mac,
        mtu,
    })
}

fn parse_mac(s: &str) -> Option<[u8; 6]> {
    let parts: Vec<u8> = s
        .split(':')
        .map(|p| u8::from_str_radix(p, 16))
        .collect::<Result<_, _>>()
        .ok()?;
    parts.try_into().ok()
}

fn run(opts: Options) -> io::Result<()> {
    // SAFETY: the caller handed us this descriptor to own.
    let host_side = unsafe { OwnedFd::from_raw_fd(opts.fd) };
    set_offload(&host_side)?;
    let ns = File::open(&opts.netns).map_err(|e| with_context(e, &opts.netns))?;
    // SAFETY: plain syscall on a namespace fd; we are single-threaded here.
    if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) } < 0 {
        return Err(with_context(io::Error::last_os_error(), "setns"));
    }
    let guest_side = create_tap(&opts.ifname)?;
    set_offload(&guest_side)?;
    configure_link(&opts.ifname, opts.mac, opts.mtu)?;
    eprintln!(
        "linnet-standin: relaying fd {} <-> {} in {}",
        opts.fd, opts.ifname, opts.netns
    );

    let host_side = Arc::new(host_side);
    let guest_side = Arc::new(guest_side);
    let (h, g) = (host_side.clone(), guest_side.clone());
    std::thread::spawn(move || relay(&h, &g));
    relay(&guest_side, &host_side);
    Ok(())
}

fn with_context(e: io::Error, what: &str) -> io::Error {
    io::Error::new(e.kind(), format!("{what}: {e}"))
}

/// Copies frames from `from` to `to` until `from` fails (its device is gone).
fn relay(from: &OwnedFd, to: &OwnedFd) {
    let mut buf = vec![0u8; BUFFER];
    loop {
        // SAFETY: buf is valid for BUFFER bytes.
        let n = unsafe { libc::read(from.as_raw_fd(), buf.as_mut_ptr().cast(), BUFFER) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            // The TAP was deleted (EBADFD) or the fd closed: the VM is gone.
            exit(0);
        }
        if n == 0 {
            exit(0);
        }
        // A write that fails drops the frame, as a NIC would.
        // SAFETY: the first n bytes of buf were just filled.
        unsafe { libc::write(to.as_raw_fd(), buf.as_ptr().cast(), n as usize) };
    }
}

#[repr(C)]
struct IfReq {
    name: [u8; libc::IFNAMSIZ],
    data: [u8; 24],
}

fn ifreq(name: &str) -> io::Result<IfReq> {
    let mut req = IfReq {
        name: [0; libc::IFNAMSIZ],
        data: [0; 24],
    };
    if name.len() >= libc::IFNAMSIZ {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("interface name {name} too long"),
        ));
    }
    req.name[..name.len()].copy_from_slice(name.as_bytes());
    Ok(req)
}

fn create_tap(name: &str) -> io::Result<OwnedFd> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_CLOEXEC)
        .open("/dev/net/tun")
        .map_err(|e| with_context(e, "/dev/net/tun"))?;
    let mut req = ifreq(name)?;
    req.data[..2].copy_from_slice(&(IFF_TAP | IFF_NO_PI | IFF_VNET_HDR).to_ne_bytes());
    // SAFETY: req is a valid struct ifreq.
    if unsafe { libc::ioctl(file.as_raw_fd(), TUNSETIFF as _, &mut req) } < 0 {
        return Err(with_context(
            io::Error::last_os_error(),
            &format!("create TAP {name}"),
        ));
    }
    Ok(file.into())
}

fn set_offload(fd: &OwnedFd) -> io::Result<()> {
    // SAFETY: TUNSETOFFLOAD takes an integer.
    if unsafe {
        libc::ioctl(
            fd.as_raw_fd(),
            TUNSETOFFLOAD as _,
            TUN_F_CSUM | TUN_F_TSO4 | TUN_F_TSO6,
        )
    } < 0
    {
        return Err(with_context(io::Error::last_os_error(), "TUNSETOFFLOAD"));
    }
    Ok(())
}

/// Sets MAC and MTU and brings the guest interface up.
fn configure_link(name: &str, mac: Option<[u8; 6]>, mtu: u32) -> io::Result<()> {
    // SAFETY: a plain datagram socket used only for interface ioctls.
    let sock = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if sock < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: we own the new socket.
    let sock = unsafe { OwnedFd::from_raw_fd(sock) };
    let ioctl = |request: libc::c_ulong, req: &mut IfReq, what: &str| {
        // SAFETY: req is a valid struct ifreq for these requests.
        if unsafe { libc::ioctl(sock.as_raw_fd(), request as _, req as *mut IfReq) } < 0 {
            return Err(with_context(io::Error::last_os_error(), what));
        }
        Ok(())
    };
    if let Some(mac) = mac {
        let mut req = ifreq(name)?;
        req.data[..2].copy_from_slice(&libc::ARPHRD_ETHER.to_ne_bytes());
        req.data[2..8].copy_from_slice(&mac);
        ioctl(libc::SIOCSIFHWADDR, &mut req, "set MAC")?;
    }
    let mut req = ifreq(name)?;
    req.data[..4].copy_from_slice(&(mtu as i32).to_ne_bytes());
    ioctl(libc::SIOCSIFMTU, &mut req, "set MTU")?;
    let mut req = ifreq(name)?;
    ioctl(libc::SIOCGIFFLAGS, &mut req, "get flags")?;
    let flags = i16::from_ne_bytes([req.data[0], req.data[1]]) | libc::IFF_UP as i16;
    req.data[..2].copy_from_slice(&flags.to_ne_bytes());
    ioctl(libc::SIOCSIFFLAGS, &mut req, "bring up")
}
