import PylonClientKit

#if canImport(Glibc)
import Glibc
#endif

/// pylonctl: command-line client for the Pylon host.
///
/// Exit status: 0 success; 1 the host answered with an error; 2 usage error;
/// 69 (EX_UNAVAILABLE) cannot reach the host; 75 (EX_TEMPFAIL) timed out.
let usage = """
    usage: pylonctl [--socket PATH] [--timeout SECONDS] COMMAND

    commands:
      call METHOD [PARAMS_JSON]   call any method; prints the result as JSON
      ping                        bus.ping
      status [--json]             plugins, clients and counters (a table; --json for scripts)
      describe                    methods each plugin serves (bus.describe)
      sub PATTERN...              print notifications on matching topics, one JSON line each
      publish TOPIC [DATA_JSON]   bus.publish
      restart PLUGIN              restart a plugin (also clears 'failed')
      consent list                all consent switches
      consent get KEY             one switch
      consent set KEY grant|deny  set a switch

    The socket is --socket, else $PYLON_SOCKET, else /run/pylon/pylon.sock.
    """

func fail(_ msg: String, code: Int32) -> Never {
    Log.writeRaw("pylonctl: " + msg + "\n")
    exit(code)
}

var socketPath = defaultSocketPath()
var timeoutMs = 30_000
var rest: [String] = []
var it = CommandLine.arguments.dropFirst().makeIterator()
while let a = it.next() {
    switch a {
    case "--socket", "-s":
        guard let v = it.next() else { fail("--socket needs a path", code: 2) }
        socketPath = v
    case "--timeout", "-t":
        guard let v = it.next(), let d = Double(v), d > 0 else { fail("--timeout needs a number of seconds", code: 2) }
        timeoutMs = Int(d * 1000)
    case "-h", "--help":
        print(usage)
        exit(0)
    default:
        rest.append(a)
    }
}
guard let command = rest.first else {
    print(usage)
    exit(2)
}
let args = Array(rest.dropFirst())

func parseJSON(_ s: String, what: String) -> JSON {
    do { return try JSON.parse(s) } catch { fail("\(what) is not valid JSON: \(error)", code: 2) }
}

@MainActor func connect() -> SyncClient {
    do { return try SyncClient(path: socketPath) } catch { fail(error.description, code: 69) }
}

/// Calls and exits with the conventional status on failure.
@MainActor func call(_ method: String, _ params: JSON?) -> JSON {
    let client = connect()
    do {
        return try client.call(method, params, timeoutMs: timeoutMs)
    } catch let e as RPCError {
        var msg = "error \(e.code): \(e.message)"
        if let d = e.data { msg += " \(d.serialized)" }
        fail(msg, code: 1)
    } catch let e as ClientError {
        fail(e.description, code: e.kind == .timeout ? 75 : 69)
    } catch {
        fail("\(error)", code: 1)
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

switch command {
case "call":
    guard let method = args.first else { fail("call needs a METHOD", code: 2) }
    let params = args.count > 1 ? parseJSON(args[1], what: "PARAMS") : nil
    print(call(method, params).serialized)
case "ping":
    print(call("bus.ping", nil).serialized)
case "describe":
    print(call("bus.describe", nil).serialized)
case "status":
    let s = call("bus.status", nil)
    if args.contains("--json") {
        print(s.serialized)
        break
    }
    print("pylond \(fmt(s["version"])) pid \(fmt(s["pid"])) \(fmt(s["state"])) up \(fmt(s["uptime_s"]))s socket \(fmt(s["socket"])) rss \(fmt(s["rss_kib"]))KiB")
    print("")
    print(pad("PLUGIN", 12) + pad("STATE", 10) + pad("PID", 9) + pad("RESTARTS", 10) + pad("UPTIME_S", 10) + pad("SERVED", 10) + pad("INFLIGHT", 10) + "NOTE")
    for p in s["plugins"]?.arrayValue ?? [] {
        let note = p["failed_reason"] ?? p["last_exit"]
        print(pad(fmt(p["name"]), 12) + pad(fmt(p["state"]), 10) + pad(fmt(p["pid"]), 9) + pad(fmt(p["restarts"]), 10)
              + pad(fmt(p["uptime_s"]), 10) + pad(fmt(p["requests_served"]), 10) + pad(fmt(p["inflight"]), 10)
              + (note == nil ? "" : fmt(note)))
    }
    let clients = s["clients"]?.arrayValue ?? []
    print("")
    print("clients: \(clients.count)   routed: \(fmt(s["counters"]?["routed"]))   inflight: \(fmt(s["counters"]?["inflight"]))   timeouts: \(fmt(s["counters"]?["timeouts"]))   protocol errors: \(fmt(s["counters"]?["protocol_errors"]))")
    let c = s["consent"]
    var sw: [String] = []
    for (k, v) in c?["switches"]?.objectValue ?? JSONObject() { sw.append("\(k)=\(v.boolValue == true ? "granted" : "denied")") }
    print("consent: master \(c?["master"]?.boolValue == false ? "denied" : "granted")" + (sw.isEmpty ? "" : "; " + sw.joined(separator: ", ")))
case "publish":
    guard let topic = args.first else { fail("publish needs a TOPIC", code: 2) }
    let data = args.count > 1 ? parseJSON(args[1], what: "DATA") : JSON.null
    print(call("bus.publish", ["topic": .string(topic), "data": data]).serialized)
case "restart":
    guard let p = args.first else { fail("restart needs a PLUGIN", code: 2) }
    print(call("bus.restart", ["plugin": .string(p)]).serialized)
case "consent":
    switch args.first {
    case "list": print(call("consent.list", nil).serialized)
    case "get":
        guard args.count == 2 else { fail("consent get KEY", code: 2) }
        print(call("consent.get", ["key": .string(args[1])]).serialized)
    case "set":
        guard args.count == 3, ["grant", "deny", "true", "false"].contains(args[2]) else { fail("consent set KEY grant|deny", code: 2) }
        let g = args[2] == "grant" || args[2] == "true"
        print(call("consent.set", ["key": .string(args[1]), "granted": .bool(g)]).serialized)
    default:
        fail("consent list | get KEY | set KEY grant|deny", code: 2)
    }
case "sub":
    guard !args.isEmpty else { fail("sub needs at least one PATTERN", code: 2) }
    let client = connect()
    do {
        for p in args { _ = try client.call("bus.subscribe", ["pattern": .string(p)], timeoutMs: timeoutMs) }
        while true {
            for n in client.notifications { print(n.serialized) }
            client.notifications.removeAll()
            if let n = try client.nextNotification(timeoutMs: 3_600_000) { print(n.serialized) }
            fflush(nil)  // line by line, also into a pipe
        }
    } catch let e as ClientError where e.kind == .closed {
        exit(0)
    } catch {
        fail("\(error)", code: 1)
    }
default:
    print(usage)
    exit(2)
}
