/*
 * pylon_auth: a mosquitto 2.0 plugin (v5 API) that checks Pylon device credentials without
 * per-device state in the broker (docs/FLEET.md, "Stateless broker credentials").
 *
 * - Username: the device id. Password: a token the backend signs,
 *   `pm1.<kid>.<expiry>.<mac>`, where mac = hex HMAC-SHA256(key[kid],
 *   "pm1.<kid>.<expiry>\n<username>\n<client id>"); expiry in Unix seconds. The token binds the
 *   username and the client id, so a device's credential works with its own client id only.
 *   The backend's own login (plugin_opt_backend_user) is signed with the client id "*" (any).
 * - ACL (pattern rules on the username, the `%u` of an acl_file): a device may subscribe to and
 *   receive `pylon/push/d/<username>` and the broadcast topic `pylon/push/all`, and publish
 *   `pylon/push/ack/<username>`, nothing else; the
 *   backend user may publish `pylon/push/#` and subscribe to and receive `pylon/push/ack/#`.
 * - Keys: plugin_opt_key_file, lines `<kid>:<hex key>` (rotation: several kids at once; the
 *   backend's --mqtt-auth-key-file holds the one it signs with, in the same form).
 *   Revocations: plugin_opt_revocation_file, one device id a line. Both are read again on
 *   SIGHUP (MOSQ_EVT_RELOAD); every device revoked since the last read is kicked
 *   (mosquitto_kick_client_by_username) and refused at its next connect.
 * - Constant-time MAC comparison; every limit a named constant; a file that cannot be read at
 *   start refuses the plugin (the broker does not start), one unreadable at a reload keeps the
 *   previous contents (logged).
 */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <mosquitto.h>
#include <mosquitto_broker.h>
#include <mosquitto_plugin.h>

#define PA_MAX_KEYS 16
#define PA_MAX_KID 16
#define PA_MIN_KEY_BYTES 16
#define PA_MAX_KEY_BYTES 64
#define PA_MAX_REVOKED 1000000
#define PA_MAX_LINE 256
#define PA_MAX_NAME 128
#define PA_MAX_TOKEN 256
#define PA_TOPIC_PREFIX_D "pylon/push/d/"
#define PA_TOPIC_PREFIX_ACK "pylon/push/ack/"
#define PA_TOPIC_BROADCAST "pylon/push/all"

struct pa_key {
	char kid[PA_MAX_KID + 1];
	unsigned char key[PA_MAX_KEY_BYTES];
	size_t len;
};

struct pa_state {
	mosquitto_plugin_id_t *id;
	char *key_file;
	char *revocation_file;
	char *backend_user;
	struct pa_key keys[PA_MAX_KEYS];
	int key_count;
	char **revoked; /* sorted */
	size_t revoked_count;
};

static int pa_hexval(int c)
{
	if(c >= '0' && c <= '9') return c - '0';
	if(c >= 'a' && c <= 'f') return c - 'a' + 10;
	if(c >= 'A' && c <= 'F') return c - 'A' + 10;
	return -1;
}

static int pa_valid_kid(const char *s, size_t n)
{
	if(n == 0 || n > PA_MAX_KID) return 0;
	for(size_t i = 0; i < n; i++){
		if(!isalnum((unsigned char)s[i]) && s[i] != '-' && s[i] != '_') return 0;
	}
	return 1;
}

static char *pa_trim(char *s)
{
	while(*s && isspace((unsigned char)*s)) s++;
	size_t n = strlen(s);
	while(n > 0 && isspace((unsigned char)s[n-1])) s[--n] = '\0';
	return s;
}

/* Reads `<kid>:<hex key>` lines. 0 on success. */
static int pa_load_keys(const char *path, struct pa_key *out, int *count)
{
	FILE *f = fopen(path, "r");
	if(!f){
		mosquitto_log_printf(MOSQ_LOG_ERR, "pylon_auth: cannot read key file %s: %s", path, strerror(errno));
		return -1;
	}
	char line[PA_MAX_LINE];
	int n = 0, rc = 0;
	while(fgets(line, sizeof(line), f)){
		char *l = pa_trim(line);
		if(*l == '\0' || *l == '#') continue;
		char *sp = strchr(l, ':');
		if(!sp || n >= PA_MAX_KEYS){ rc = -1; break; }
		*sp = '\0';
		char *hex = pa_trim(sp + 1);
		size_t hl = strlen(hex);
		if(!pa_valid_kid(l, strlen(l)) || hl % 2 || hl / 2 < PA_MIN_KEY_BYTES || hl / 2 > PA_MAX_KEY_BYTES){ rc = -1; break; }
		for(size_t i = 0; i < hl / 2; i++){
			int hi = pa_hexval(hex[2*i]), lo = pa_hexval(hex[2*i+1]);
			if(hi < 0 || lo < 0){ rc = -1; break; }
			out[n].key[i] = (unsigned char)(hi * 16 + lo);
		}
		if(rc) break;
		out[n].len = hl / 2;
		strcpy(out[n].kid, l);
		n++;
	}
	fclose(f);
	if(rc || n == 0){
		mosquitto_log_printf(MOSQ_LOG_ERR,
			"pylon_auth: key file %s: want 1 to %d lines `<kid>:<hex key>` (kid 1-%d of [A-Za-z0-9_-], key %d-%d bytes)",
			path, PA_MAX_KEYS, PA_MAX_KID, PA_MIN_KEY_BYTES, PA_MAX_KEY_BYTES);
		return -1;
	}
	*count = n;
	return 0;
}

static int pa_cmp(const void *a, const void *b)
{
	return strcmp(*(char * const *)a, *(char * const *)b);
}

static void pa_free_list(char **list, size_t n)
{
	for(size_t i = 0; i < n; i++) free(list[i]);
	free(list);
}

/* Reads one device id a line (sorted, for bsearch). A missing file is an empty list. */
static int pa_load_revoked(const char *path, char ***out, size_t *count)
{
	*out = NULL;
	*count = 0;
	FILE *f = fopen(path, "r");
	if(!f){
		if(errno == ENOENT) return 0;
		mosquitto_log_printf(MOSQ_LOG_ERR, "pylon_auth: cannot read revocation file %s: %s", path, strerror(errno));
		return -1;
	}
	size_t cap = 0, n = 0;
	char **list = NULL;
	char line[PA_MAX_LINE];
	int rc = 0;
	while(fgets(line, sizeof(line), f)){
		char *l = pa_trim(line);
		if(*l == '\0' || *l == '#') continue;
		if(n >= PA_MAX_REVOKED || strlen(l) > PA_MAX_NAME){ rc = -1; break; }
		if(n == cap){
			cap = cap ? cap * 2 : 64;
			char **grown = realloc(list, cap * sizeof(char *));
			if(!grown){ rc = -1; break; }
			list = grown;
		}
		list[n] = strdup(l);
		if(!list[n]){ rc = -1; break; }
		n++;
	}
	fclose(f);
	if(rc){
		mosquitto_log_printf(MOSQ_LOG_ERR, "pylon_auth: revocation file %s: at most %d ids of at most %d bytes",
			path, PA_MAX_REVOKED, PA_MAX_NAME);
		pa_free_list(list, n);
		return -1;
	}
	if(n) qsort(list, n, sizeof(char *), pa_cmp);
	*out = list;
	*count = n;
	return 0;
}

static int pa_is_revoked(const struct pa_state *st, const char *user)
{
	if(!st->revoked_count) return 0;
	return bsearch(&user, st->revoked, st->revoked_count, sizeof(char *), pa_cmp) != NULL;
}

static int pa_equal_ct(const char *a, const char *b, size_t n)
{
	unsigned char d = 0;
	for(size_t i = 0; i < n; i++) d |= (unsigned char)(a[i] ^ b[i]);
	return d == 0;
}

/* 1 when `password` is a valid, unexpired token for (username, client id). */
static int pa_check_token(const struct pa_state *st, const char *user, const char *client_id, const char *password)
{
	size_t plen = strlen(password);
	if(plen > PA_MAX_TOKEN || strncmp(password, "pm1.", 4) != 0) return 0;
	const char *kid = password + 4;
	const char *dot1 = strchr(kid, '.');
	if(!dot1) return 0;
	const char *exp = dot1 + 1;
	const char *dot2 = strchr(exp, '.');
	if(!dot2) return 0;
	const char *mac = dot2 + 1;
	size_t kidlen = (size_t)(dot1 - kid), explen = (size_t)(dot2 - exp);
	if(!pa_valid_kid(kid, kidlen) || explen == 0 || explen > 12 || strlen(mac) != 64) return 0;
	long long expiry = 0;
	for(size_t i = 0; i < explen; i++){
		if(!isdigit((unsigned char)exp[i])) return 0;
		expiry = expiry * 10 + (exp[i] - '0');
	}
	if((long long)time(NULL) >= expiry) return 0;
	const struct pa_key *key = NULL;
	for(int i = 0; i < st->key_count; i++){
		if(strlen(st->keys[i].kid) == kidlen && memcmp(st->keys[i].kid, kid, kidlen) == 0){ key = &st->keys[i]; break; }
	}
	if(!key) return 0;
	char msg[PA_MAX_TOKEN + 2 * PA_MAX_NAME + 8];
	int mlen = snprintf(msg, sizeof(msg), "%.*s\n%s\n%s", (int)(dot2 - password), password, user, client_id);
	if(mlen < 0 || (size_t)mlen >= sizeof(msg)) return 0;
	unsigned char digest[EVP_MAX_MD_SIZE];
	unsigned int dlen = 0;
	if(!HMAC(EVP_sha256(), key->key, (int)key->len, (const unsigned char *)msg, (size_t)mlen, digest, &dlen) || dlen != 32) return 0;
	char hex[65];
	static const char digits[] = "0123456789abcdef";
	for(unsigned int i = 0; i < 32; i++){ hex[2*i] = digits[digest[i] >> 4]; hex[2*i+1] = digits[digest[i] & 15]; }
	hex[64] = '\0';
	return pa_equal_ct(hex, mac, 64);
}

static int pa_basic_auth(int event, void *event_data, void *userdata)
{
	(void)event;
	struct mosquitto_evt_basic_auth *ed = event_data;
	struct pa_state *st = userdata;
	const char *user = ed->username, *pw = ed->password;
	const char *cid = mosquitto_client_id(ed->client);
	if(!user || !pw || !cid || strlen(user) > PA_MAX_NAME || strlen(cid) > PA_MAX_NAME) return MOSQ_ERR_AUTH;
	int backend = st->backend_user && strcmp(user, st->backend_user) == 0;
	if(!backend && pa_is_revoked(st, user)){
		mosquitto_log_printf(MOSQ_LOG_NOTICE, "pylon_auth: refused revoked device %s", user);
		return MOSQ_ERR_AUTH;
	}
	if(pa_check_token(st, user, backend ? "*" : cid, pw)) return MOSQ_ERR_SUCCESS;
	return MOSQ_ERR_AUTH;
}

static int pa_topic_is(const char *topic, const char *prefix, const char *user)
{
	size_t pl = strlen(prefix);
	return strncmp(topic, prefix, pl) == 0 && strcmp(topic + pl, user) == 0;
}

static int pa_acl_check(int event, void *event_data, void *userdata)
{
	(void)event;
	struct mosquitto_evt_acl_check *ed = event_data;
	struct pa_state *st = userdata;
	const char *user = mosquitto_client_username(ed->client);
	const char *topic = ed->topic;
	if(!user || !topic) return MOSQ_ERR_ACL_DENIED;
	if(ed->access == MOSQ_ACL_UNSUBSCRIBE) return MOSQ_ERR_SUCCESS;
	if(st->backend_user && strcmp(user, st->backend_user) == 0){
		if(ed->access == MOSQ_ACL_WRITE) return strncmp(topic, "pylon/push/", 11) == 0 ? MOSQ_ERR_SUCCESS : MOSQ_ERR_ACL_DENIED;
		return strncmp(topic, PA_TOPIC_PREFIX_ACK, strlen(PA_TOPIC_PREFIX_ACK)) == 0 ? MOSQ_ERR_SUCCESS : MOSQ_ERR_ACL_DENIED;
	}
	switch(ed->access){
		case MOSQ_ACL_SUBSCRIBE:
		case MOSQ_ACL_READ:
			if(strcmp(topic, PA_TOPIC_BROADCAST) == 0) return MOSQ_ERR_SUCCESS;
			return pa_topic_is(topic, PA_TOPIC_PREFIX_D, user) ? MOSQ_ERR_SUCCESS : MOSQ_ERR_ACL_DENIED;
		case MOSQ_ACL_WRITE:
			return pa_topic_is(topic, PA_TOPIC_PREFIX_ACK, user) ? MOSQ_ERR_SUCCESS : MOSQ_ERR_ACL_DENIED;
		default:
			return MOSQ_ERR_ACL_DENIED;
	}
}

/* Reads both files again; kicks the devices revoked since the last read. */
static int pa_reload(int event, void *event_data, void *userdata)
{
	(void)event;
	(void)event_data;
	struct pa_state *st = userdata;
	struct pa_key keys[PA_MAX_KEYS];
	int kc = 0;
	if(pa_load_keys(st->key_file, keys, &kc) == 0){
		memcpy(st->keys, keys, sizeof(keys));
		st->key_count = kc;
	}else{
		mosquitto_log_printf(MOSQ_LOG_WARNING, "pylon_auth: keeping the previous keys");
	}
	if(!st->revocation_file) return MOSQ_ERR_SUCCESS;
	char **list = NULL;
	size_t n = 0;
	if(pa_load_revoked(st->revocation_file, &list, &n) != 0){
		mosquitto_log_printf(MOSQ_LOG_WARNING, "pylon_auth: keeping the previous revocation list");
		return MOSQ_ERR_SUCCESS;
	}
	char **old = st->revoked;
	size_t old_n = st->revoked_count;
	st->revoked = list;
	st->revoked_count = n;
	size_t kicked = 0;
	for(size_t i = 0; i < n; i++){
		if(old_n && bsearch(&list[i], old, old_n, sizeof(char *), pa_cmp)) continue;
		mosquitto_kick_client_by_username(list[i], false);
		kicked++;
	}
	pa_free_list(old, old_n);
	mosquitto_log_printf(MOSQ_LOG_NOTICE, "pylon_auth: reloaded %d keys, %zu revoked devices (%zu newly revoked, kicked)",
		st->key_count, n, kicked);
	return MOSQ_ERR_SUCCESS;
}

int mosquitto_plugin_version(int supported_version_count, const int *supported_versions)
{
	for(int i = 0; i < supported_version_count; i++){
		if(supported_versions[i] == 5) return 5;
	}
	return -1;
}

int mosquitto_plugin_init(mosquitto_plugin_id_t *identifier, void **userdata, struct mosquitto_opt *opts, int opt_count)
{
	struct pa_state *st = calloc(1, sizeof(*st));
	if(!st) return MOSQ_ERR_NOMEM;
	st->id = identifier;
	for(int i = 0; i < opt_count; i++){
		if(!strcmp(opts[i].key, "key_file")) st->key_file = strdup(opts[i].value);
		else if(!strcmp(opts[i].key, "revocation_file")) st->revocation_file = strdup(opts[i].value);
		else if(!strcmp(opts[i].key, "backend_user")) st->backend_user = strdup(opts[i].value);
		else mosquitto_log_printf(MOSQ_LOG_WARNING, "pylon_auth: unknown option %s ignored", opts[i].key);
	}
	if(!st->key_file || pa_load_keys(st->key_file, st->keys, &st->key_count) != 0
		|| (st->revocation_file && pa_load_revoked(st->revocation_file, &st->revoked, &st->revoked_count) != 0)){
		if(!st->key_file) mosquitto_log_printf(MOSQ_LOG_ERR, "pylon_auth: plugin_opt_key_file is required");
		free(st->key_file); free(st->revocation_file); free(st->backend_user); free(st);
		return MOSQ_ERR_INVAL;
	}
	*userdata = st;
	mosquitto_callback_register(identifier, MOSQ_EVT_BASIC_AUTH, pa_basic_auth, NULL, st);
	mosquitto_callback_register(identifier, MOSQ_EVT_ACL_CHECK, pa_acl_check, NULL, st);
	mosquitto_callback_register(identifier, MOSQ_EVT_RELOAD, pa_reload, NULL, st);
	mosquitto_log_printf(MOSQ_LOG_NOTICE, "pylon_auth: %d keys, %zu revoked devices", st->key_count, st->revoked_count);
	return MOSQ_ERR_SUCCESS;
}

int mosquitto_plugin_cleanup(void *userdata, struct mosquitto_opt *opts, int opt_count)
{
	(void)opts;
	(void)opt_count;
	struct pa_state *st = userdata;
	if(!st) return MOSQ_ERR_SUCCESS;
	mosquitto_callback_unregister(st->id, MOSQ_EVT_BASIC_AUTH, pa_basic_auth, NULL);
	mosquitto_callback_unregister(st->id, MOSQ_EVT_ACL_CHECK, pa_acl_check, NULL);
	mosquitto_callback_unregister(st->id, MOSQ_EVT_RELOAD, pa_reload, NULL);
	pa_free_list(st->revoked, st->revoked_count);
	free(st->key_file); free(st->revocation_file); free(st->backend_user); free(st);
	return MOSQ_ERR_SUCCESS;
}
