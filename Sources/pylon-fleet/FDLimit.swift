import PylonCore

#if canImport(Glibc)
import Glibc
#endif

/// The descriptor limit: raised as far as allowed, and what it leaves for devices.
enum FDLimit {
    /// Raises RLIMIT_NOFILE: as root the hard limit to fs.nr_open, then the soft one to the
    /// hard one. Returns the soft limit in force and how it was reached.
    static func raise() -> (limit: Int, note: String) {
        var r = rlimit()
        getrlimit(Int32(RLIMIT_NOFILE.rawValue), &r)
        var note = "soft raised to the hard limit"
        if getuid() == 0, let b = System.readFile("/proc/sys/fs/nr_open", limit: 64),
            let n = rlim_t(String(decoding: b.filter { $0 >= 0x30 && $0 <= 0x39 }, as: UTF8.self)), n > r.rlim_max
        {
            var h = r
            h.rlim_max = n
            h.rlim_cur = n
            if setrlimit(Int32(RLIMIT_NOFILE.rawValue), &h) == 0 {
                r = h
                note = "hard raised to fs.nr_open as root"
            }
        }
        if r.rlim_cur < r.rlim_max {
            var s = r
            s.rlim_cur = r.rlim_max
            if setrlimit(Int32(RLIMIT_NOFILE.rawValue), &s) == 0 { r = s } else { note = "setrlimit refused" }
        }
        return (Int(min(r.rlim_cur, rlim_t(Int32.max))), note)
    }

    /// Descriptors per simulated device: its MQTT socket and the socketpair libmosquitto opens
    /// in every `mosquitto_new` (for `mosquitto_loop`'s wake-ups; unused on a libuv loop, but
    /// not optional). Measured: 3,000 devices held 7,300 descriptors.
    static let fdsPerDevice = 3

    /// Devices that fit, after the reserve and the HTTP connections.
    static func deviceCapacity(limit: Int, inflight: Int) -> Int {
        max(0, (limit - FleetOptions.Limits.fdReserve - inflight) / fdsPerDevice)
    }
}
