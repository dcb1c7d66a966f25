import PylonClientKit
import PylonProtocol

#if canImport(Glibc)
import Glibc
#endif

/// pylonctl: command-line client for the Pylon host. Exit statuses follow sysexits(3); the
/// table is in `usage` below, pylonctl(1) and docs/PROTOCOL.md. Each command's own usage and
/// options are in `Commands.swift` (`pylonctl COMMAND --help`).
let exitStatusTable = """
       0  success
       1  the host or a plugin answered with a JSON-RPC error
       2  status: a plugin is not running yet or again (starting, backing off after a crash, stopped)
       3  status, wait-ready: a plugin is failed (its restart intensity was spent; restart clears it)
      64  usage error (EX_USAGE): unknown command or option, bad arguments, invalid JSON
      65  with --check: the reply's "code" is not 0 (EX_DATAERR)
      69  the host cannot be reached, or went away (sub, monitor with --no-reconnect) (EX_UNAVAILABLE)
      75  no reply within the timeout; wait-ready: not ready in time (EX_TEMPFAIL)
      77  the host refused the call: not permitted, -32005 (EX_NOPERM)
      78  reload: the new configuration was refused, -32010; the running one stays (EX_CONFIG)
    """

let usage = """
    usage: pylonctl [--socket PATH] [--timeout SECONDS] [--check] [--pretty] COMMAND [ARGS]
           (the options may also follow the command; pylonctl COMMAND --help for one command)

    commands:
    \(Command.all.map { "  " + ($0.synopsis.count < 30 ? pad($0.synopsis, 30) : $0.synopsis + "\n" + pad("", 32)) + " " + $0.summary }.joined(separator: "\n"))

    options:
      -s, --socket PATH    the host's socket: --socket, else $PYLON_SOCKET, else /run/pylon/pylon.sock
      -t, --timeout SECS   how long to wait for a reply (default 30; wait-ready: how long to wait in all)
      --check              exit 65 when a plugin's reply carries a non-zero "code" (MA's result codes)
      --pretty             print JSON results indented
      --version, --help

    exit status:
    \(exitStatusTable)
    """

func fail(_ msg: String, code: Int32) -> Never {
    Log.writeRaw("pylonctl: " + msg + "\n")
    exit(code)
}

var socketPath = defaultSocketPath()
var timeoutMs = 30_000
var timeoutGiven = false
var checkCodes = false
var pretty = false
var rest: [String] = []
/// The command's own options (`Command.flags`, `Command.valueOptions`), by name.
var flags: Set<String> = []
var values: [String: String] = [:]
var command: Command?
var it = CommandLine.arguments.dropFirst().makeIterator()
// Global options are read wherever they stand (`call M P --check` checks too). After the
// command, its own options are taken; any other word that looks like an option (`--x`, `-x`) is
// an unknown option, while "-" (standard input) and "-1" (a JSON number) are arguments.
while let a = it.next() {
    switch a {
    case "--socket", "-s":
        guard let v = it.next() else { fail("--socket needs a path", code: 64) }
        socketPath = v
    case "--timeout", "-t":
        guard let v = it.next(), let d = Double(v), d >= 0.001, d <= 1_000_000 else {
            fail("--timeout needs a number of seconds from 0.001 to 1000000", code: 64)
        }
        timeoutMs = Int(d * 1000)
        timeoutGiven = true
    case "--check":
        checkCodes = true
    case "--pretty":
        pretty = true
    case "-h", "--help":
        print(command?.help ?? usage)
        exit(0)
    case "--version":
        print("pylonctl \(pylonClientVersion)")
        exit(0)
    default:
        guard let cmd = command else {
            if a.hasPrefix("-") { fail("unknown option \(a) (see pylonctl --help)", code: 64) }
            if a == "help" {
                // `pylonctl help [COMMAND]`
                if let n = it.next() {
                    guard let c = Command.named(n) else { fail("unknown command \(n) (see pylonctl --help)", code: 64) }
                    print(c.help)
                } else {
                    print(usage)
                }
                exit(0)
            }
            guard let c = Command.named(a) else { fail("unknown command \(a) (see pylonctl --help)", code: 64) }
            command = c
            continue
        }
        if a == "--" {
            // The rest are arguments, even those that look like options (conformance's EXEC ARG...).
            while let r = it.next() { rest.append(r) }
        } else if cmd.flags.contains(a) {
            flags.insert(a)
        } else if cmd.valueOptions.contains(a) {
            guard let v = it.next() else { fail("\(a) needs a value (see pylonctl \(cmd.name) --help)", code: 64) }
            values[a] = v
        } else if Command.looksLikeOption(a) {
            fail("unknown option \(a) for \(cmd.name) (see pylonctl \(cmd.name) --help)", code: 64)
        } else {
            rest.append(a)
        }
    }
}
guard let command else {
    Log.writeRaw(usage + "\n")
    exit(64)
}
let args = rest

func parseJSON(_ s: String, what: String) -> JSON {
    do { return try JSON.parse(s) } catch { fail("\(what) is not valid JSON: \(error)", code: 64) }
}

@MainActor func connect() -> SyncClient {
    do { return try SyncClient(path: socketPath) } catch {
        // The socket is there but not ours to open: say whose group lets one in.
        if access(socketPath, F_OK) == 0, access(socketPath, W_OK) != 0 {
            var st = stat()
            let group = stat(socketPath, &st) == 0 ? getgrgid(st.st_gid).map { String(cString: $0.pointee.gr_name) } : nil
            fail(
                "permission denied on \(socketPath): members of group \(group ?? "of the socket") may connect"
                    + " (usermod -aG \(group ?? "GROUP") $USER, then log in again)", code: 69)
        }
        fail(error.description, code: 69)
    }
}

/// A result as JSON text: compact, or indented with --pretty.
@MainActor func text(_ j: JSON) -> String { pretty ? j.prettySerialized : j.serialized }

/// Calls and exits with the conventional status on failure.
@MainActor func call(_ method: String, _ params: JSON?, client: SyncClient? = nil) -> JSON {
    let client = client ?? connect()
    do {
        return try client.call(method, params, timeoutMs: timeoutMs)
    } catch let e as RPCError {
        var msg = "error \(e.code): \(e.message)"
        if let d = e.data { msg += " \(d.serialized)" }
        let code: Int32
        switch e.code {
        case RPCError.Code.notPermitted.rawValue: code = 77
        case RPCError.Code.configRefused.rawValue: code = 78
        default: code = 1
        }
        fail(msg, code: code)
    } catch let e as ClientError {
        fail(e.description, code: e.kind == .timeout ? 75 : 69)
    } catch {
        fail("\(error)", code: 1)
    }
}

/// Prints a plugin's reply; with --check a non-zero `code` member is exit status 65.
@MainActor func printChecked(_ r: JSON) {
    print(text(r))
    if checkCodes, let c = r["code"]?.intValue, c != 0 {
        fail("reply code \(c)" + (r["message"]?.stringValue.map { ": " + $0 } ?? ""), code: 65)
    }
}

func pad(_ s: String, _ n: Int) -> String { s.count >= n ? s : s + String(repeating: " ", count: n - s.count) }

func fmt(_ j: JSON?) -> String {
    switch j {
    case .none, .some(.null): return "-"
    case .some(.string(let s)): return s
    case .some(.double(let d)):
        let t = (d * 10).rounded() / 10
        return String(t)
    case .some(let v): return v.serialized
    }
}

switch command.name {
case "call":
    guard let method = args.first else { fail("call needs a METHOD", code: 64) }
    var params: JSON?
    if args.count > 1 {
        if args[1] == "-" {
            var input: [UInt8] = []
            var buf = [UInt8](repeating: 0, count: 65_536)
            while case let n = read(0, &buf, buf.count), n > 0 { input += buf[0..<n] }
            params = parseJSON(String(decoding: input, as: UTF8.self), what: "PARAMS (standard input)")
        } else {
            params = parseJSON(args[1], what: "PARAMS")
        }
    }
    printChecked(call(method, params))
case "ping":
    print(text(call(HostMethod.ping, nil)))
case "describe":
    if flags.contains("--openrpc") {
        guard args.isEmpty else { fail("describe --openrpc takes no METHOD (see pylonctl describe --help)", code: 64) }
        print(text(call(HostMethod.describe, ["format": "openrpc"])))
        exit(0)
    }
    let d = call(HostMethod.describe, nil)
    if let method = args.first {
        guard args.count == 1 else { fail("describe takes one METHOD (see pylonctl describe --help)", code: 64) }
        if flags.contains("--json") {
            guard let m = describedMethodJSON(d, method) else {
                fail("unknown method \(method) (pylonctl describe --names lists them)", code: 1)
            }
            print(text(m))
        } else {
            guard let t = describeMethodText(d, method) else {
                fail("unknown method \(method) (pylonctl describe --names lists them)", code: 1)
            }
            print(t)
        }
    } else if flags.contains("--json") {
        print(text(d))
    } else if flags.contains("--names") {
        for m in describedMethods(d) { print(m.name) }
    } else {
        print(describeText(d))
    }
case "metrics":
    let client = connect()
    let bus = call(HostMethod.status, nil, client: client)
    let described = call(HostMethod.describe, nil, client: client)
    var statuses: [(String, JSON)] = []
    for (name, p) in described["plugins"]?.objectValue ?? JSONObject() where p["state"]?.stringValue == "running" {
        guard (p["methods"]?.arrayValue ?? []).contains(where: { $0["name"]?.stringValue == name + ".status" }) else { continue }
        if let r = try? client.call(name + ".status", nil, timeoutMs: timeoutMs) { statuses.append((name, r)) }
    }
    print(MetricsText.render(bus: bus, plugins: statuses), terminator: "")
case "status":
    let s = call(HostMethod.status, nil)
    // Like `systemctl is-failed`, for scripts: 3 when a plugin is failed, 2 when one is not
    // running yet or again (starting, backing off after a crash, stopping), 0 when all run.
    let states = (s["plugins"]?.arrayValue ?? []).compactMap { $0["state"]?.stringValue }
    let statusCode = statusExitCode(states)
    if flags.contains("--json") {
        print(text(s))
        exit(statusCode)
    }
    print(
        "pylond \(fmt(s["version"])) pid \(fmt(s["pid"])) \(fmt(s["state"])) up \(fmt(s["uptime_s"]))s socket \(fmt(s["socket"])) rss \(fmt(s["rss_kib"]))KiB"
    )
    print("")
    print(
        pad("PLUGIN", 12) + pad("STATE", 10) + pad("PID", 9) + pad("RESTARTS", 10) + pad("UPTIME_S", 10) + pad("SERVED", 10)
            + pad("INFLIGHT", 10) + "NOTE")
    for p in s["plugins"]?.arrayValue ?? [] {
        let note = p["failed_reason"] ?? p["last_exit"]
        print(
            pad(fmt(p["name"]), 12) + pad(fmt(p["state"]), 10) + pad(fmt(p["pid"]), 9) + pad(fmt(p["restarts"]), 10)
                + pad(fmt(p["uptime_s"]), 10) + pad(fmt(p["requests_served"]), 10) + pad(fmt(p["inflight"]), 10)
                + (note == nil ? "" : fmt(note)))
    }
    let clients = s["clients"]?.arrayValue ?? []
    print("")
    print(
        "clients: \(clients.count)   routed: \(fmt(s["counters"]?["routed"]))   inflight: \(fmt(s["counters"]?["inflight"]))   timeouts: \(fmt(s["counters"]?["timeouts"]))   protocol errors: \(fmt(s["counters"]?["protocol_errors"]))"
    )
    let c = s["consent"]
    var sw: [String] = []
    for (k, v) in c?["switches"]?.objectValue ?? JSONObject() { sw.append("\(k)=\(v.boolValue == true ? "granted" : "denied")") }
    print(
        "consent: master \(c?["master"]?.boolValue == false ? "denied" : "granted")" + (sw.isEmpty ? "" : "; " + sw.joined(separator: ", "))
    )
    for line in maWaitLines(s, nowMs: System.wallClockMs()) { print(line) }
    exit(statusCode)
case "publish":
    guard let topic = args.first else { fail("publish needs a TOPIC", code: 64) }
    let data = args.count > 1 ? parseJSON(args[1], what: "DATA") : JSON.null
    print(text(call(HostMethod.publish, ["topic": .string(topic), "data": data])))
case "restart":
    guard let p = args.first else { fail("restart needs a PLUGIN", code: 64) }
    print(text(call(HostMethod.restart, ["plugin": .string(p)])))
case "consent":
    switch args.first {
    case "list": print(text(call(HostMethod.consentList, nil)))
    case "get":
        guard args.count == 2 else { fail("usage: consent get KEY", code: 64) }
        print(text(call(HostMethod.consentGet, ["key": .string(args[1])])))
    case "set":
        let values = ["allow": true, "grant": true, "true": true, "deny": false, "revoke": false, "false": false]
        guard args.count == 3, let g = values[args[2]] else {
            fail("usage: consent set KEY allow|deny|grant|revoke|true|false", code: 64)
        }
        print(text(call(HostMethod.consentSet, ["key": .string(args[1]), "granted": .bool(g)])))
    case "clear":
        guard args.count == 2 else { fail("usage: consent clear KEY", code: 64) }
        print(text(call(HostMethod.consentClear, ["key": .string(args[1])])))
    default:
        fail("usage: consent list | get KEY | set KEY allow|deny|grant|revoke|true|false | clear KEY", code: 64)
    }
case "sub":
    guard !args.isEmpty else { fail("sub needs at least one PATTERN", code: 64) }
    follow(
        reconnect: !flags.contains("--no-reconnect"), lost: "the host closed the connection",
        setup: { c in for p in args { _ = try c.call(HostMethod.subscribe, ["pattern": .string(p)], timeoutMs: timeoutMs) } },
        show: { print($0.serialized) })
case "dead-letters":  // the uploader's dead letters: list, requeue, discard (DeadLetters.swift)
    deadLettersCommand(args)
case "owner":  // admins: uploader.setOwner, ma.setOwner, push.setOwner (Owner.swift)
    ownerCommand(args)
case "monitor":
    monitorCommand(args, verbose: flags.contains("--verbose"), json: flags.contains("--json"), reconnect: !flags.contains("--no-reconnect"))
case "reload":
    reloadCommand(json: flags.contains("--json"))
case "wait-ready":
    waitReadyCommand(timeoutMs: timeoutGiven ? timeoutMs : 30_000)
case "conformance":  // Conformance.swift
    conformanceCommand(args, name: values["--as"], configText: values["--config"], reference: values["--reference"])
case "log-level":
    guard args.count == 1 else { fail("log-level needs one LEVEL: debug, info, warn or error\n" + command.help, code: 64) }
    var p: JSONObject = ["level": .string(args[0])]
    if let name = values["--plugin"] { p["plugin"] = .string(name) }
    print(text(call(HostMethod.logLevel, .object(p))))
default:
    fail("unknown command \(command.name) (see pylonctl --help)", code: 64)
}
