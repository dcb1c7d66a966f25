/// The commands: their synopsis, one-line summary, own options and `pylonctl COMMAND --help`.
struct Command {
    let name: String
    let synopsis: String
    let summary: String
    /// Options without a value the command takes (`--json`).
    var flags: Set<String> = []
    /// Options with a value (`--plugin NAME`).
    var valueOptions: Set<String> = []
    /// What `--help` adds below the synopsis.
    var details: String = ""

    var help: String {
        var h = "usage: pylonctl [OPTIONS] \(synopsis)\n\n  \(summary)\n"
        if !details.isEmpty { h += "\n" + details + "\n" }
        h += "\n(global options: --socket PATH, --timeout SECONDS, --check, --pretty; see pylonctl --help)"
        return h
    }

    static func named(_ n: String) -> Command? { all.first { $0.name == n } }

    /// `--x`, `-x`: an option. `-` (standard input) and `-1` (a JSON number) are arguments.
    static func looksLikeOption(_ a: String) -> Bool {
        let u = Array(a.utf8)
        guard u.count >= 2, u[0] == UInt8(ascii: "-") else { return false }
        let c = u[1]
        return c == UInt8(ascii: "-") || (c >= 0x41 && c <= 0x5A) || (c >= 0x61 && c <= 0x7A)
    }

    static let all: [Command] = [
        Command(
            name: "call", synopsis: "call METHOD [PARAMS_JSON | -]", summary: "call any method; prints the result as JSON",
            details: """
                  PARAMS_JSON  the params, an object or an array ("-": read them from standard input)
                  --check      exit 65 when the reply carries a non-zero "code" (MA's result codes)
                  --pretty     indent the result
                """),
        Command(name: "ping", synopsis: "ping", summary: "bus.ping: the host answers with its version"),
        Command(
            name: "status", synopsis: "status [--json]", summary: "plugins, clients and counters (a table; --json for scripts)",
            flags: ["--json"],
            details: """
                  exit status, like `systemctl is-failed`: 0 the host and every plugin are running;
                  2 a plugin is not running yet or again (starting, backing off after a crash,
                  stopped); 3 a plugin is failed (its restart intensity was spent: `pylonctl restart
                  PLUGIN` clears it); 69 the host cannot be reached.
                """),
        Command(
            name: "describe", synopsis: "describe [METHOD] [--json | --names | --openrpc]",
            summary: "methods the host and each plugin serve: params, results, consent switches",
            flags: ["--json", "--names", "--openrpc"],
            details: """
                  METHOD      one method: who serves it, its consent switch, its params (name, JSON
                              type, required, description) and its result's members; exit 1 for a
                              method nobody serves
                  --json      the bus.describe result (with METHOD: that method's entry)
                  --names     the method names, one per line (shell completion uses them)
                  --openrpc   the methods as an OpenRPC 1.2.6 document (bus.describe {"format":"openrpc"})
                """),
        Command(
            name: "sub", synopsis: "sub PATTERN... [--no-reconnect]", summary: "print notifications on matching topics, one JSON line each",
            flags: ["--no-reconnect"],
            details: """
                  When the host goes away (a restart, an upgrade) sub connects again, with backoff,
                  subscribes again and says on stderr how long the gap was: what was published
                  meanwhile was missed. --no-reconnect: exit 69 instead.
                """),
        Command(
            name: "monitor", synopsis: "monitor [PATTERN] [--verbose] [--json] [--no-reconnect]",
            summary: "admins: watch every routed request, reply, notification and publication",
            flags: ["--verbose", "--json", "--no-reconnect"],
            details: """
                  PATTERN     method pattern, `*` matching any run of characters (default: *), e.g. 'echo.*'
                  --verbose   also print each message's params (replies: the result)
                  --json      one JSON object per event (the bus.monitor.event params) instead of text
                  One line per event: time, type (request, reply, notification, publication),
                  method, from -> to, the caller (uid, pid or plugin), size in bytes, and for
                  replies the latency and "ok" or the error code. A monitor that does not keep up
                  is disconnected by the host; routing never waits for it. When the connection
                  ends (that, or a restart of the host) monitor connects again with backoff and
                  says on stderr how long the gap was; --no-reconnect: exit 69 instead.
                """),
        Command(name: "publish", synopsis: "publish TOPIC [DATA_JSON]", summary: "bus.publish"),
        Command(name: "restart", synopsis: "restart PLUGIN", summary: "restart a plugin (also clears 'failed')"),
        Command(
            name: "reload", synopsis: "reload [--json]",
            summary: "re-read the host's configuration file (as SIGHUP does), with the outcome",
            flags: ["--json"],
            details: """
                  Prints what changed (plugins added, removed, restarted) and each setting that a
                  reload cannot apply (socket, socketMode, socketGroup, stateDir: restart pylond).
                  A refused configuration is reported with its file:line:col or setting, the running
                  one stays, and the exit status is 78 (pylond.service's ExecReload, so `systemctl
                  reload pylond` fails too). For admins and pylond's own user.
                """),
        Command(
            name: "wait-ready", synopsis: "wait-ready [--timeout SECONDS]",
            summary: "wait until the host and every enabled plugin are running (for scripts)",
            details: """
                  --timeout SECONDS   how long to wait in all (default 30)
                  exit status: 0 ready; 3 a plugin is failed (it will not become ready by itself);
                  75 not ready in time (the message says what is missing).
                """),
        Command(
            name: "log-level", synopsis: "log-level LEVEL [--plugin NAME]",
            summary: "admins: set the host's or a plugin's log level at run time",
            valueOptions: ["--plugin"],
            details: """
                  LEVEL          debug, info, warn or error
                  --plugin NAME  that plugin's level instead of the host's (kept across its restarts)
                  The host's run-time level lasts until the next reload or restart of pylond.
                """),
        Command(
            name: "consent", synopsis: "consent list | get KEY | set KEY VALUE | clear KEY",
            summary: "consent switches (non-admins: list shows the device switch only)",
            details: """
                  VALUE: allow, grant, true (granted) or deny, revoke, false
                  clear: back to never set (granted unless an app denied it)
                """),
        Command(name: "metrics", synopsis: "metrics", summary: "bus and plugin status as Prometheus text"),
        Command(
            name: "owner", synopsis: "owner set PLUGIN NAME OWNER | release PLUGIN NAME",
            summary: "admins: hand an uploader stream, MA AppKey or push appId to another uid, or release it",
            details: ownerUsage),
        Command(
            name: "conformance", synopsis: "conformance --as NAME [--config JSON] [--] EXEC [ARG...]",
            summary: "check another implementation of a plugin against the real one's declared contract",
            valueOptions: ["--as", "--config", "--reference"], details: conformanceUsage),
        Command(
            name: "dead-letters", synopsis: "dead-letters list|requeue|discard ...", summary: "the uploader's dead letters",
            details: deadLettersUsage),
    ]
}

/// `status`'s exit code from the plugins' states, like `systemctl is-failed`: 3 when one is
/// failed, 2 when one is not running (starting, backoff, stopped), 0 when all run.
func statusExitCode(_ states: [String]) -> Int32 {
    if states.contains("failed") { return 3 }
    return states.allSatisfy { $0 == "running" } ? 0 : 2
}
