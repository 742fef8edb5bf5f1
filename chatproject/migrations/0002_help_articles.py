"""The demo's help centre: a few dozen articles, two drafts and three for signed-in users only."""

from django.db import migrations

# (slug, title, paragraphs, published, members_only)
ARTICLES = [
    ("create-account", "Creating an account", [
        "To create an account, choose Sign up at the top of any page and enter your email address and a password of "
        "at least twelve characters.",
        "We send a confirmation link to that address. The account is ready once you open the link; it expires "
        "after 24 hours, and you can ask for a new one from the sign-in page."], True, False),
    ("reset-password", "Resetting a forgotten password", [
        "On the sign-in page choose Forgot password and enter your email address. We email you a link that lets "
        "you choose a new password; it works once and for one hour.",
        "No email? Look in your spam folder, and check that you typed the address you signed up with."], True, False),
    ("change-email", "Changing your email address", [
        "Open Settings, then Account, and enter the new address. We confirm the change at both the old and the "
        "new address before it takes effect."], True, False),
    ("two-factor", "Turning on two-factor authentication", [
        "Two-factor authentication asks for a code from an authenticator app each time you sign in on a new "
        "device. Open Settings, Security, and scan the QR code with the app.",
        "Keep the recovery codes we show you somewhere safe: each one signs you in once if you lose your phone."],
        True, False),
    ("delete-account", "Deleting your account", [
        "Open Settings, Account, and choose Delete account. Your data is removed within 30 days; invoices are "
        "kept for as long as the tax law requires."], True, False),
    ("export-data", "Exporting your data", [
        "You can download everything you stored with us as a ZIP archive of CSV files. Open Settings, Privacy, "
        "and choose Export my data; we email a download link when the archive is ready, usually within minutes."],
        True, False),
    ("shipping-times", "Shipping times and carriers", [
        "Orders placed before 2 pm on a working day leave our warehouse the same day. Standard delivery takes 3 to "
        "5 working days in Europe and 7 to 12 elsewhere.",
        "We ship with DHL and the national postal services; the confirmation email names the carrier."], True,
        False),
    ("track-order", "Tracking an order", [
        "Every shipped order has a tracking number in its confirmation email and on the Orders page. Tracking "
        "starts within a day of the order leaving the warehouse."], True, False),
    ("international-shipping", "Shipping outside the European Union", [
        "We ship to most countries. Customs duties and import taxes are charged by the destination country and "
        "paid by the recipient on delivery."], True, False),
    ("returns", "Returning an item", [
        "You may return any item within 30 days of delivery. Start the return on the Orders page: we email a "
        "prepaid return label.",
        "Pack the item in its original packaging if you still have it. Refunds are paid once the item reaches us."],
        True, False),
    ("refund-timing", "When will I get my refund?", [
        "Refunds go back to the original payment method within 5 working days of the return reaching our "
        "warehouse. Your bank may take a few more days to show it."], True, False),
    ("damaged-item", "An item arrived damaged", [
        "Sorry about that. Send us a photo of the damage from the Orders page within 14 days of delivery and we "
        "send a replacement at no cost, or refund you if it is out of stock."], True, False),
    ("payment-methods", "Payment methods we accept", [
        "We accept Visa, Mastercard, American Express, PayPal and bank transfer. Bank transfers are confirmed "
        "within two working days, and the order ships after that."], True, False),
    ("invoices", "Downloading invoices", [
        "Every order's invoice is a PDF on the Orders page. Business customers can add a VAT number in Settings, "
        "Billing, before ordering so that it appears on the invoice."], True, False),
    ("discount-codes", "Using a discount code", [
        "Enter the code in the basket before you pay. One code per order; codes cannot be added after payment."],
        True, False),
    ("gift-cards", "Gift cards", [
        "Gift cards are sold in amounts from 10 to 500 euros and are valid for three years. A gift card can pay "
        "for part of an order, and the rest stays on the card."], True, False),
    ("opening-hours", "Opening hours of our support team", [
        "Our support team answers chat and email from 8 am to 8 pm Central European Time, Monday to Saturday. "
        "On public holidays the team works from 10 am to 4 pm."], True, False),
    ("contact-support", "Contacting support", [
        "Write to support@example.com or use this chat. For an order, give its number: it starts with ORD and is "
        "in the confirmation email."], True, False),
    ("store-locations", "Our shops", [
        "Our shops are in Madrid (Calle Mayor 10) and Lisbon (Rua Augusta 25). Both open from 10 am to 9 pm, "
        "Monday to Saturday."], True, False),
    ("warranty", "Warranty on electronics", [
        "Electronics carry a two-year warranty from the delivery date. For a repair, start a warranty claim on the "
        "Orders page; we collect the item at no cost."], True, False),
    ("size-guide", "Finding your size", [
        "Each product page has a size table in centimetres. Between two sizes, choose the larger one; exchanges "
        "for another size are free within 30 days."], True, False),
    ("newsletter", "Subscribing to the newsletter", [
        "The newsletter comes once a month with new products and offers. Unsubscribe with the link at the bottom "
        "of any issue, or in Settings, Notifications."], True, False),
    ("privacy", "How we use your personal data", [
        "We use your data only to deliver your orders and, if you agreed, to send the newsletter. We never sell "
        "it. The full privacy policy lists every processor we use."], True, False),
    ("cookies", "Cookies on this site", [
        "We use a session cookie to keep you signed in and a CSRF cookie to protect forms. No advertising "
        "cookies are used."], True, False),
    ("accessibility", "Accessibility", [
        "The site works with a keyboard alone and with screen readers. Tell us about anything that gets in your "
        "way: we answer accessibility reports within two working days."], True, False),
    ("chat-widget", "About this chat assistant", [
        "The assistant answers from the help articles of this site and links the articles it used under its "
        "answer. It cannot see your orders or your payment details."], True, False),
    ("api-keys", "Creating API keys", [
        "Developers can create API keys in Settings, Developers. A key is shown once; store it in your secret "
        "manager and revoke it from the same page if it leaks."], True, False),
    ("loyalty-programme", "The loyalty programme for members", [
        "Members collect one point per euro spent. 100 points give a 5 euro voucher, sent by email on the first "
        "day of each month."], True, True),
    ("member-early-access", "Early access to sales for members", [
        "Signed-in members see each sale 24 hours before everyone else. The sale page opens for them at 8 am on "
        "its first day."], True, True),
    ("member-free-shipping", "Free shipping for members", [
        "Members get free standard shipping on every order above 20 euros, in Europe and beyond."], True, True),
    ("summer-sale-draft", "Summer sale (draft)", [
        "The summer sale starts on the first of July with 30 percent off all sandals. Not announced yet."], False,
        False),
    ("price-change-draft", "New prices from next year (draft)", [
        "Shipping prices rise by one euro next year. This article is a draft and must not be quoted."], False,
        False),
]


def add_articles(apps, schema_editor):
    Article = apps.get_model("chatproject", "Article")
    for slug, title, paragraphs, published, members_only in ARTICLES:
        Article.objects.update_or_create(slug=slug, defaults={
            "title": title, "body": "".join(f"<p>{text}</p>" for text in paragraphs), "published": published,
            "members_only": members_only})


def remove_articles(apps, schema_editor):
    apps.get_model("chatproject", "Article").objects.filter(slug__in=[a[0] for a in ARTICLES]).delete()


class Migration(migrations.Migration):

    dependencies = [("chatproject", "0001_initial")]

    operations = [migrations.RunPython(add_articles, remove_articles)]
