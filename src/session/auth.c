/* SPDX-License-Identifier: BSD-3-Clause */
#include "auth.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include <sodium.h>

/* Key = BLAKE2b-256 of a label and the secret, so a passphrase of any length
 * (or a run name) becomes a uniform key. */
static void derive(struct mp_auth *a, const void *secret, size_t len)
{
	static const char label[] = "moshpit run key v1";
	crypto_generichash_state st;

	crypto_generichash_init(&st, NULL, 0, MP_KEY_BYTES);
	crypto_generichash_update(&st, (const unsigned char *)label, sizeof(label));
	crypto_generichash_update(&st, secret, len);
	crypto_generichash_final(&st, a->key, MP_KEY_BYTES);
}

int mp_auth_init(struct mp_auth *a, const char *run_name, const char *key_text,
		 const char *key_file)
{
	if (sodium_init() < 0)
		return -EIO;
	memset(a, 0, sizeof(*a));
	if (key_text) {
		if (!*key_text)
			return -EINVAL;
		derive(a, key_text, strlen(key_text));
		snprintf(a->source, sizeof(a->source), "MP_RUN_KEY");
		return 0;
	}
	if (key_file) {
		unsigned char buf[4096];
		size_t n;
		FILE *f = fopen(key_file, "rb");

		if (!f)
			return errno == EACCES ? -EACCES : -ENOENT;
		n = fread(buf, 1, sizeof(buf), f);
		fclose(f);
		while (n && (buf[n - 1] == '\n' || buf[n - 1] == '\r' || buf[n - 1] == ' ' ||
			     buf[n - 1] == '\t'))
			n--;
		if (!n)
			return -EINVAL;
		derive(a, buf, n);
		sodium_memzero(buf, sizeof(buf));
		snprintf(a->source, sizeof(a->source), "file %.50s", key_file);
		return 0;
	}
	derive(a, run_name ? run_name : "", run_name ? strlen(run_name) : 0);
	a->from_name = 1;
	snprintf(a->source, sizeof(a->source), "run name");
	return 0;
}

void mp_auth_mac(const struct mp_auth *a, enum mp_auth_domain domain,
		 const struct mp_auth_piece *pieces, int n, uint8_t mac[MP_MAC_BYTES])
{
	crypto_auth_hmacsha256_state st;
	unsigned char d = (unsigned char)domain;

	crypto_auth_hmacsha256_init(&st, a->key, MP_KEY_BYTES);
	crypto_auth_hmacsha256_update(&st, &d, 1);
	for (int i = 0; i < n; i++) {
		/* Length-prefixed, so that moving bytes between pieces changes the MAC. */
		unsigned char len[8];
		uint64_t l = pieces[i].len;
		for (int b = 0; b < 8; b++)
			len[b] = (unsigned char)(l >> (8 * b));
		crypto_auth_hmacsha256_update(&st, len, sizeof(len));
		if (pieces[i].len)
			crypto_auth_hmacsha256_update(&st, pieces[i].p, pieces[i].len);
	}
	crypto_auth_hmacsha256_final(&st, mac);
}

int mp_auth_verify(const struct mp_auth *a, enum mp_auth_domain domain,
		   const struct mp_auth_piece *pieces, int n, const uint8_t mac[MP_MAC_BYTES])
{
	uint8_t want[MP_MAC_BYTES];

	mp_auth_mac(a, domain, pieces, n, want);
	return sodium_memcmp(want, mac, MP_MAC_BYTES) ? -EACCES : 0;
}

void mp_auth_random(void *buf, size_t len)
{
	randombytes_buf(buf, len);
}
