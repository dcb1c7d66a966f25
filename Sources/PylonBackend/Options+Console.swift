/// The console's command-line options (`Options.console`).
package struct ConsoleOptions: Equatable {
    /// `--console-dir DIR`: the console's files, served at `/`.
    package var dir: String?
    /// `--session-idle-ms`, `--session-max-ms`, `--cookie-secure`.
    package var sessionIdleMs = SessionLimits.defaultIdleMs
    package var sessionMaxMs = SessionLimits.defaultAbsoluteMs
    package var cookieSecure = false
    /// `--enable-reset`: `POST /v1/admin/reset` deletes the data; 404 without it.
    package var enableReset = false
    /// `--metrics-token-file PATH`: a bearer token for `GET /metrics` only.
    package var metricsTokenFile: String?
    /// `--add-operator NAME --role viewer|admin --password-file PATH`: create or update the
    /// account, then exit.
    package var addOperator: String?
    package var role = "viewer"
    package var passwordFile: String?

    package init() {}

    package static let usage = """
        Operators and the console (docs/CONSOLE.md, docs/SECURITY.md "Operators and sessions"):
          --console-dir DIR   serve the console's files from DIR at / (read once at start;
                              without it every path outside /v1, /healthz and /metrics is 404)
          --session-idle-ms MS
                              an operator session unused this long ends (default 1800000)
          --session-max-ms MS a session ends this long after its login (default 43200000)
          --cookie-secure     the session cookie is Secure (set it when the console is reached
                              over https, e.g. behind a TLS proxy)
          --enable-reset      POST /v1/admin/reset deletes all data (tests; 404 reset_disabled
                              without it)
          --metrics-token-file PATH
                              a bearer token (0600 file) that may read GET /metrics only
          --add-operator NAME --role viewer|admin --password-file PATH
                              create the operator account NAME (or set its role and password)
                              in --db, then exit; PATH (0600) holds the password (16 to 4096
                              printable characters)
        """

    /// Takes `flag` (and its value) if it is one of these options.
    mutating func parse(_ flag: String, _ value: () throws(Options.UsageError) -> String) throws(Options.UsageError) -> Bool {
        func ms() throws(Options.UsageError) -> Int64 {
            let v = try value()
            guard let n = Int64(v), n > 0 else { throw Options.UsageError(description: "\(flag) expects a positive integer") }
            return n
        }
        switch flag {
        case "--console-dir": dir = try value()
        case "--session-idle-ms": sessionIdleMs = try ms()
        case "--session-max-ms": sessionMaxMs = try ms()
        case "--cookie-secure": cookieSecure = true
        case "--enable-reset": enableReset = true
        case "--metrics-token-file": metricsTokenFile = try value()
        case "--add-operator":
            let v = try value()
            guard SessionLimits.validName(v), v != SessionLimits.tokenName else {
                throw Options.UsageError(
                    description: "--add-operator: the name must be \(Router.operatorNameRule), not \(SessionLimits.tokenName)")
            }
            addOperator = v
        case "--role":
            let v = try value()
            guard Role(rawValue: v) != nil else { throw Options.UsageError(description: "--role is viewer or admin") }
            role = v
        case "--password-file": passwordFile = try value()
        default: return false
        }
        return true
    }

    func validate() throws(Options.UsageError) {
        if (addOperator == nil) != (passwordFile == nil) {
            throw Options.UsageError(description: "--add-operator and --password-file go together")
        }
    }
}
