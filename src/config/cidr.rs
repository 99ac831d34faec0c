//! IP ranges as written in the routing file (`10.0.0.0/8`, `::1`, `fd00::/8`):
//! who may read `/status` (`[server] status_allowed`).

use std::net::IpAddr;

/// An address and how many of its leading bits a peer must share with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    addr: IpAddr,
    bits: u8,
}

impl Cidr {
    /// `addr` alone (every bit), or `addr/bits`. The address is the range's
    /// first one: host bits set (`10.0.0.1/8`) are refused, since such a
    /// line usually means something else than it says.
    pub fn parse(text: &str) -> Result<Cidr, String> {
        let (addr, bits) = match text.split_once('/') {
            Some((addr, bits)) => (addr, Some(bits)),
            None => (text, None),
        };
        let addr: IpAddr =
            addr.trim().parse().map_err(|_| format!("`{text}` is not an IP address or CIDR range"))?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let bits = match bits {
            None => max,
            Some(b) => match b.parse::<u8>() {
                Ok(n) if n <= max && b.bytes().all(|c| c.is_ascii_digit()) => n,
                _ => return Err(format!("`{text}`: the prefix length must be 0 to {max}")),
            },
        };
        let cidr = Cidr { addr, bits };
        if cidr.masked(addr) != bits_of(addr) {
            return Err(format!("`{text}` has host bits set (did you mean {}?)", cidr.network()));
        }
        Ok(cidr)
    }

    /// Whether `ip` is in the range (an IPv4-mapped IPv6 peer, `::ffff:a.b.c.d`,
    /// as the IPv4 address it is).
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        ip.is_ipv4() == self.addr.is_ipv4() && self.masked(ip) == bits_of(self.addr)
    }

    fn masked(&self, ip: IpAddr) -> u128 {
        let width = if ip.is_ipv4() { 32 } else { 128 };
        let host = width - u32::from(self.bits);
        let mask = if host >= 128 { 0 } else { (u128::MAX >> (128 - width)) >> host << host };
        bits_of(ip) & mask
    }

    fn network(&self) -> String {
        let width = if self.addr.is_ipv4() { 32 } else { 128 };
        let net = self.masked(self.addr);
        let addr = match width {
            32 => IpAddr::from((net as u32).to_be_bytes()),
            _ => IpAddr::from(net.to_be_bytes()),
        };
        format!("{addr}/{}", self.bits)
    }
}

impl std::fmt::Display for Cidr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.addr, self.bits)
    }
}

fn bits_of(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(v4) => u128::from(u32::from(v4)),
        IpAddr::V6(v6) => u128::from(v6),
    }
}

/// Who may read `/status` when the file says nothing: this host only.
pub fn loopback() -> Vec<Cidr> {
    vec![Cidr::parse("127.0.0.0/8").expect("valid"), Cidr::parse("::1").expect("valid")]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn ranges_and_single_addresses() {
        let net = Cidr::parse("10.1.0.0/16").unwrap();
        assert!(net.contains(ip("10.1.200.3")));
        assert!(!net.contains(ip("10.2.0.1")));
        assert!(net.contains(ip("::ffff:10.1.0.9")), "an IPv4-mapped peer is its IPv4 address");
        assert!(!net.contains(ip("::1")));
        let one = Cidr::parse("192.168.1.7").unwrap();
        assert!(one.contains(ip("192.168.1.7")) && !one.contains(ip("192.168.1.8")));
        let v6 = Cidr::parse("fd00::/8").unwrap();
        assert!(v6.contains(ip("fd12::1")) && !v6.contains(ip("fe80::1")));
        let all = Cidr::parse("0.0.0.0/0").unwrap();
        assert!(all.contains(ip("203.0.113.9")) && !all.contains(ip("2001:db8::1")));
        assert!(Cidr::parse("::/0").unwrap().contains(ip("2001:db8::1")));
        assert!(loopback().iter().any(|c| c.contains(ip("127.0.0.53"))));
        assert!(loopback().iter().any(|c| c.contains(ip("::1"))));
        assert!(!loopback().iter().any(|c| c.contains(ip("10.0.0.1"))));
    }

    #[test]
    fn what_is_refused() {
        for bad in ["10.0.0.1/8", "10.0.0.0/33", "10.0.0.0/+8", "example.com", "10.0.0.0/", "::1/129", ""] {
            assert!(Cidr::parse(bad).is_err(), "{bad}");
        }
        let e = Cidr::parse("10.0.0.1/8").unwrap_err();
        assert!(e.contains("did you mean 10.0.0.0/8"), "{e}");
    }
}
