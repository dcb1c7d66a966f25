import PylonCore

/// Command-line configuration of `pylon-backend`.
struct Options {
    var host = "127.0.0.1"
    var port: UInt16 = 8780
    /// SQLite database path; `:memory:` keeps everything in memory for the life of the process.
    var dbPath = ":memory:"
    var maxBody = Limits.defaultMaxBody
    var logLevel = Log.Level.info

    static let usage = """
        usage: pylon-backend [--listen HOST:PORT] [--db PATH] [--max-body BYTES] [--log-level LEVEL]

          --listen HOST:PORT  address to listen on (default 127.0.0.1:8780; port 0 picks a free port;
                              IPv6 as [::1]:PORT)
          --db PATH           SQLite database (default :memory:, i.e. nothing survives a restart)
          --max-body BYTES    largest request body, as sent and after gunzip (default 1048576)
          --log-level LEVEL   debug, info, warn or error (default info)

        Prints "pylon-backend listening on HOST:PORT" on stdout once it accepts connections.
        """

    struct UsageError: Error, CustomStringConvertible { let description: String }

    /// Parses `arguments` (without the program name). `--help` is reported as a `UsageError`
    /// with an empty description.
    static func parse(_ arguments: [String]) throws(UsageError) -> Options {
        var o = Options()
        var it = arguments.makeIterator()
        while let a = it.next() {
            func value() throws(UsageError) -> String {
                guard let v = it.next() else { throw UsageError(description: "\(a) needs a value") }
                return v
            }
            switch a {
            case "--listen":
                let v = try value()
                guard let (h, p) = splitHostPort(v) else {
                    throw UsageError(description: "--listen expects HOST:PORT, got \(v)")
                }
                o.host = h
                o.port = p
            case "--db":
                o.dbPath = try value()
            case "--max-body":
                let v = try value()
                guard let n = Int(v), n > 0 else { throw UsageError(description: "--max-body expects a positive integer") }
                o.maxBody = n
            case "--log-level":
                let v = try value()
                guard let l = Log.Level(name: v) else { throw UsageError(description: "unknown log level \(v)") }
                o.logLevel = l
            case "-h", "--help":
                throw UsageError(description: "")
            default:
                throw UsageError(description: "unknown argument \(a)")
            }
        }
        return o
    }

    /// Splits `HOST:PORT` or `[V6HOST]:PORT`; `localhost` means 127.0.0.1.
    static func splitHostPort(_ s: String) -> (String, UInt16)? {
        guard let colon = s.lastIndex(of: ":"), let port = UInt16(s[s.index(after: colon)...]) else { return nil }
        var host = String(s[..<colon])
        if host.hasPrefix("[") && host.hasSuffix("]") { host = String(host.dropFirst().dropLast()) }
        if host == "localhost" { host = "127.0.0.1" }
        guard !host.isEmpty else { return nil }
        return (host, port)
    }
}
